"""The one generic call between any tailer and the scheduler: ``submit(items) -> outcomes``.

A batch travels as one message, encoded with fastavro from ``schemas/submit.avsc`` and
``schemas/outcomes.avsc``. Items and outcomes are plain dicts (TypedDicts) because the
hot path builds and reads thousands of them a second; no Kafka type crosses this line and
``source_ref`` is opaque to the scheduler.
"""

from __future__ import annotations

import array
import hashlib
import io
import json
import sys
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

import fastavro

from asynctier.platform.schemas import load_schema, schema_json

Status = Literal["ok", "retry", "failed"]

#: Why an item did not succeed, when the scheduler or the source knows (``Outcome.reason``,
#: and the ``asynctier.reason`` header of a dead letter). A field, never parsed out of text.
UNDECODABLE = "undecodable"  # the payload does not decode with the binding's format
TOO_LARGE = "too_large"  # the record is too large for a call, or for a delay topic
REJECTED = "rejected"  # the function raised Reject
FUNCTION_ERROR = "function_error"  # the function is not found or its module not allowed
TIMEOUT = "timeout"  # the function ran past the binding's timeout
MAX_ATTEMPTS = "max_attempts"  # the binding's max attempts are spent
BINDING_REMOVED = "binding_removed"  # the binding went away while the record waited
EXPIRED = "expired"  # not started within the binding's --expire-after: never run late
UNKNOWN_SCHEMA = "unknown_schema"  # framed with a schema id the registry does not have
NOT_FRAMED = "not_framed"  # a registry binding's record without the registry's framing
REGISTRY_UNAVAILABLE = "registry_unavailable"  # a retry: the schema registry did not answer
#: The reasons of a payload that did not decode: they say nothing of a function's health.
DECODE_REASONS = frozenset({UNDECODABLE, UNKNOWN_SCHEMA, NOT_FRAMED, REGISTRY_UNAVAILABLE})


class Header(TypedDict):
    """A record header."""

    name: str
    value: bytes | None


class Item(TypedDict):
    """One unit of work: a record of some source, for one binding."""

    id: int
    binding: str
    payload: bytes | None
    key: bytes | None
    headers: list[Header]
    attempt: int
    source_ref: str
    record_time_ms: int
    priority: int  # higher runs first within a binding (a queue item's; 0 for a topic's)
    deadline_ms: int | None  # epoch ms by which it should start, when the source says
    #: True when its tailer knows no copy of it was sent before: it runs without waiting
    #: for its run-once claim (docs/design.md, Run once off the path). Absent: False.
    #: Once the scheduler's run-once guard took it, its running range and its offset.
    fresh: NotRequired[Any]


class Outcome(TypedDict):
    """What became of one item: ``ok``, ``retry`` (after ``after_s``) or ``failed``.

    ``spends_attempt`` is false for a retry the scheduler chose (over quota, held back by
    downstream protection): the record comes back with the same attempt number. ``reason``
    says why, when known (:data:`UNDECODABLE`, :data:`TIMEOUT` ...).
    """

    id: int
    status: Status
    after_s: float | None
    error: str | None
    spends_attempt: bool
    reason: str | None


def ok(item_id: int) -> Outcome:
    """A success."""
    return {"id": item_id, "status": "ok", "after_s": None, "error": None,
            "spends_attempt": True, "reason": None}


def retry(item_id: int, error: str, after_s: float | None = None,
          spends_attempt: bool = True, reason: str | None = None) -> Outcome:
    """Run again later; ``after_s=None`` follows the binding's ladder."""
    return {"id": item_id, "status": "retry", "after_s": after_s, "error": error,
            "spends_attempt": spends_attempt, "reason": reason}


def failed(item_id: int, error: str, reason: str = REJECTED) -> Outcome:
    """Failed for good: a dead letter, for ``reason``."""
    return {"id": item_id, "status": "failed", "after_s": None, "error": error,
            "spends_attempt": True, "reason": reason}


_LITTLE = sys.byteorder == "little"


def _pack(typecode: str, values: list[int] | list[float]) -> bytes:
    """Numbers as a little-endian packed array (``i``: int32, ``q``: int64, ``d``:
    float64)."""
    packed = array.array(typecode, values)
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, data: bytes) -> list[Any]:
    packed = array.array(typecode)
    packed.frombytes(data)
    if not _LITTLE:
        packed.byteswap()
    return packed.tolist()


def _cut(blob: bytes, lens: list[int]) -> list[bytes | None]:
    """Cut ``blob`` into pieces of ``lens`` (-1: None)."""
    out: list[bytes | None] = []
    at = 0
    for n in lens:
        if n < 0:
            out.append(None)
        else:
            out.append(blob[at:at + n])
            at += n
    return out


class Columns:
    """A batch being built column by column (the fast way for a tailer to make one).

    ``add`` appends one item; :meth:`encode` gives the submit request's bytes. Ids are the
    items' positions (0, 1, 2 ...) unless given to :meth:`encode`.
    """

    __slots__ = ("attempts", "binding_of", "bindings", "deadlines_ms", "fresh", "headers",
                 "key_lens", "keys", "payload_lens", "payloads", "priorities",
                 "record_times_ms", "source_refs")

    def __init__(self) -> None:
        self.bindings: dict[str, int] = {}
        self.binding_of: list[int] = []
        self.payloads: list[bytes] = []
        self.payload_lens: list[int] = []
        self.keys: list[bytes] = []
        self.key_lens: list[int] = []
        self.attempts: list[int] = []
        self.source_refs: list[str] = []
        self.record_times_ms: list[int] = []
        self.headers: list[dict[str, Any]] = []
        self.priorities: list[int] | None = None  # None while every item has 0
        self.deadlines_ms: list[int] | None = None  # None while no item has one (-1: none)
        self.fresh: bytearray | None = None  # None while no item is fresh

    def __len__(self) -> int:
        return len(self.payload_lens)

    def add(self, binding: str, payload: bytes | None, key: bytes | None,
            headers: Sequence[tuple[str, bytes | None]] | None, attempt: int,
            source_ref: str, record_time_ms: int, priority: int = 0,
            deadline_ms: int | None = None, fresh: bool = False) -> None:
        """Append one item."""
        i = len(self.payload_lens)
        b = self.bindings.get(binding)
        if b is None:
            b = self.bindings[binding] = len(self.bindings)
        self.binding_of.append(b)
        if payload is None:
            self.payload_lens.append(-1)
        else:
            self.payloads.append(payload)
            self.payload_lens.append(len(payload))
        if key is None:
            self.key_lens.append(-1)
        else:
            self.keys.append(key)
            self.key_lens.append(len(key))
        self.attempts.append(attempt)
        self.source_refs.append(source_ref)
        self.record_times_ms.append(record_time_ms)
        if headers:
            self.headers += [{"item": i, "name": k, "value": v} for k, v in headers]
        if priority or self.priorities is not None:
            if self.priorities is None:
                self.priorities = [0] * i
            self.priorities.append(priority)
        if deadline_ms is not None or self.deadlines_ms is not None:
            if self.deadlines_ms is None:
                self.deadlines_ms = [-1] * i
            self.deadlines_ms.append(-1 if deadline_ms is None else deadline_ms)
        if fresh or self.fresh is not None:
            if self.fresh is None:
                self.fresh = bytearray(i)
            self.fresh.append(fresh)

    def encode(self, ids: list[int] | None = None) -> bytes:
        """The submit request's bytes (ids default to the positions)."""
        count = len(self.payload_lens)
        attempts = self.attempts
        attempt = attempts[0] if attempts else 1
        uniform = all(a == attempt for a in attempts)
        refs = "\n".join(self.source_refs)
        if refs.count("\n") != max(count - 1, 0):
            raise ValueError("a source_ref must not contain a newline")
        doc = {
            "count": count,
            "bindings": list(self.bindings),
            "binding_of": b"" if len(self.bindings) <= 1 else _pack("i", self.binding_of),
            "ids": b"" if ids is None else _pack("q", ids),
            "attempt": attempt,
            "attempts": b"" if uniform else _pack("i", attempts),
            "payloads": b"".join(self.payloads),
            "payload_lens": _pack("i", self.payload_lens),
            "keys": b"".join(self.keys),
            "key_lens": _pack("i", self.key_lens),
            "source_refs": refs,
            "record_times_ms": _pack("q", self.record_times_ms),
            "headers": self.headers,
            "priorities": b"" if self.priorities is None else _pack("i", self.priorities),
            "deadlines_ms": b"" if self.deadlines_ms is None else _pack("q", self.deadlines_ms),
            "fresh": b"" if self.fresh is None else bytes(self.fresh),
        }
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, load_schema("submit"), doc)
        return buf.getvalue()


def encode_items(items: list[Item]) -> bytes:
    """One submit request as bytes (column by column, see ``schemas/submit.avsc``); none
    of its items fresh (a call made of items again is a copy sent again)."""
    cols = Columns()
    for item in items:
        cols.add(item["binding"], item["payload"], item["key"],
                 [(h["name"], h["value"]) for h in item["headers"]], item["attempt"],
                 item["source_ref"], item["record_time_ms"], item["priority"],
                 item["deadline_ms"])
    return cols.encode([item["id"] for item in items])


_NO_HEADERS: list[Header] = []


def decode_items(data: bytes) -> list[Item]:
    """The items of one submit request; ValueError (or another decoding error) when the
    bytes are not one. A request comes from outside the process: its count must be the
    length of its columns (nothing is allocated by a count alone), its ids distinct, and
    every index it holds (a header's item, an item's binding) in range."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("submit"), None)
    count: int = doc["count"]
    names: list[str] = doc["bindings"]
    if count != len(doc["payload_lens"]) // 4 or count < 0:
        raise ValueError(f"count {count} is not the number of items the columns hold "
                         f"({len(doc['payload_lens']) // 4})")
    ids = _unpack("q", doc["ids"]) if doc["ids"] else range(count)
    if len(set(ids)) != len(ids):
        raise ValueError("two items have the same id")
    attempts = _unpack("i", doc["attempts"]) if doc["attempts"] else [doc["attempt"]] * count
    payloads = _cut(doc["payloads"], _unpack("i", doc["payload_lens"]))
    keys = _cut(doc["keys"], _unpack("i", doc["key_lens"]))
    refs = doc["source_refs"].split("\n") if count else []
    times = _unpack("q", doc["record_times_ms"])
    priorities = _unpack("i", doc["priorities"]) if doc["priorities"] else [0] * count
    deadlines: list[int | None] = ([None if d < 0 else d for d in _unpack("q", doc["deadlines_ms"])]
                                   if doc["deadlines_ms"] else [None] * count)
    fresh: bytes = doc["fresh"]
    if fresh and len(fresh) != count:
        raise ValueError(f"{len(fresh)} fresh flags for {count} items")
    headers: list[list[Header]] = [_NO_HEADERS] * count
    for h in doc["headers"]:
        i = h["item"]
        if not 0 <= i < count:
            raise ValueError(f"a header names item {i}, not one of the {count}")
        if headers[i] is _NO_HEADERS:
            headers[i] = []
        headers[i].append({"name": h["name"], "value": h["value"]})
    binding_of = (_unpack("i", doc["binding_of"]) if len(names) > 1 and doc["binding_of"]
                  else [0] * count)
    if count and (not names or min(binding_of) < 0 or max(binding_of) >= len(names)):
        raise ValueError(f"an item names binding {min(binding_of)} or {max(binding_of)}, not "
                         f"one of the {len(names)}")
    items: list[Item] = [
        {"id": ident, "binding": names[b], "payload": payload, "key": key, "headers": hs,
         "attempt": attempt, "source_ref": ref, "record_time_ms": at, "priority": priority,
         "deadline_ms": deadline}
        for ident, b, payload, key, hs, attempt, ref, at, priority, deadline in zip(
            ids, binding_of, payloads, keys, headers, attempts, refs, times, priorities,
            deadlines, strict=True)]
    if fresh:
        for item, flag in zip(items, fresh, strict=True):
            if flag:
                item["fresh"] = True
    return items


def encode_outcomes(outcomes: list[Outcome]) -> bytes:
    """One submit response as bytes, column by column: the ok ids, then every other outcome,
    each distinct error text sent once (a failing function usually fails the same way)."""
    ok_ids: list[int] = []
    ids: list[int] = []
    failed_: list[bool] = []
    after: list[float] = []
    error_of: list[int] = []
    spends: list[bool] = []
    reason_of: list[int] = []
    errors: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for o in outcomes:
        if o["status"] == "ok":
            ok_ids.append(o["id"])
            continue
        ids.append(o["id"])
        failed_.append(o["status"] == "failed")
        after.append(-1.0 if o["after_s"] is None else o["after_s"])
        error = o["error"]
        error_of.append(-1 if error is None else errors.setdefault(error, len(errors)))
        spends.append(o["spends_attempt"])
        reason = o["reason"]
        reason_of.append(-1 if reason is None else reasons.setdefault(reason, len(reasons)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("outcomes"), {
        "ok_ids": _pack("q", ok_ids), "ids": _pack("q", ids), "failed": bytes(failed_),
        "after_s": _pack("d", after), "error_of": _pack("i", error_of),
        "spends_attempt": bytes(spends), "errors": list(errors),
        "reason_of": _pack("i", reason_of), "reasons": list(reasons)})
    return buf.getvalue()


def decode_outcomes(data: bytes) -> list[Outcome]:
    """The outcomes of one submit response."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("outcomes"), None)
    outcomes: list[Outcome] = [
        {"id": i, "status": "ok", "after_s": None, "error": None, "spends_attempt": True,
         "reason": None}
        for i in _unpack("q", doc["ok_ids"])]
    errors: list[str] = doc["errors"]
    reasons: list[str] = doc["reasons"]
    outcomes += [
        {"id": i, "status": "failed" if bad else "retry",
         "after_s": None if after < 0 else after,
         "error": None if e < 0 else errors[e], "spends_attempt": bool(spends),
         "reason": None if r < 0 else reasons[r]}
        for i, bad, after, e, spends, r in zip(_unpack("q", doc["ids"]), doc["failed"],
                                               _unpack("d", doc["after_s"]),
                                               _unpack("i", doc["error_of"]),
                                               doc["spends_attempt"],
                                               _unpack("i", doc["reason_of"]), strict=True)]
    return outcomes


def fingerprint(schemas: Sequence[Any]) -> str:
    """12 hex digits naming ``schemas`` (JSON) as a whole, docs included: the layout of the
    packed ``bytes`` columns (int64 little-endian, -1 for none...) is written only there."""
    digest = hashlib.sha256()
    for schema in schemas:
        digest.update(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()[:12]


def wire_version() -> str:
    """The version of the submit call's wire: the fingerprint of its two schemas. Tailers
    and schedulers built from the same schemas share it; any change to either changes it."""
    return fingerprint([schema_json("submit"), schema_json("outcomes")])

"""The one generic call between any tailer and the scheduler: ``submit(items) -> outcomes``.

A batch travels as one message, encoded with fastavro from ``schemas/submit.avsc`` and
``schemas/outcomes.avsc``. Items and outcomes are plain dicts (TypedDicts) because the
hot path builds and reads thousands of them a second; no Kafka type crosses this line and
``source_ref`` is opaque to the scheduler.
"""

from __future__ import annotations

import io
from typing import Any, Literal, TypedDict

import fastavro

from asynctier.platform.schemas import load_schema

Status = Literal["ok", "retry", "failed"]


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


class Outcome(TypedDict):
    """What became of one item: ``ok``, ``retry`` (after ``after_s``) or ``failed``.

    ``spends_attempt`` is false for a retry the scheduler chose (over quota, held back by
    downstream protection): the record comes back with the same attempt number.
    """

    id: int
    status: Status
    after_s: float | None
    error: str | None
    spends_attempt: bool


def ok(item_id: int) -> Outcome:
    """A success."""
    return {"id": item_id, "status": "ok", "after_s": None, "error": None,
            "spends_attempt": True}


def retry(item_id: int, error: str, after_s: float | None = None,
          spends_attempt: bool = True) -> Outcome:
    """Run again later; ``after_s=None`` follows the binding's ladder."""
    return {"id": item_id, "status": "retry", "after_s": after_s, "error": error,
            "spends_attempt": spends_attempt}


def failed(item_id: int, error: str) -> Outcome:
    """Failed for good: a dead letter."""
    return {"id": item_id, "status": "failed", "after_s": None, "error": error,
            "spends_attempt": True}


def encode_items(items: list[Item]) -> bytes:
    """One submit request as bytes (column by column, see ``schemas/submit.avsc``)."""
    bindings: dict[str, int] = {}
    payload_nulls: list[int] = []
    key_nulls: list[int] = []
    headers: list[dict[str, Any]] = []
    payloads: list[bytes] = []
    keys: list[bytes] = []
    for i, item in enumerate(items):
        payload, key = item["payload"], item["key"]
        if payload is None:
            payload_nulls.append(i)
            payload = b""
        if key is None:
            key_nulls.append(i)
            key = b""
        payloads.append(payload)
        keys.append(key)
        for header in item["headers"]:
            headers.append({"item": i, "name": header["name"], "value": header["value"]})
    doc = {
        "bindings": bindings,
        "binding_of": [bindings.setdefault(item["binding"], len(bindings)) for item in items],
        "ids": [item["id"] for item in items],
        "payloads": payloads,
        "payload_nulls": payload_nulls,
        "keys": keys,
        "key_nulls": key_nulls,
        "attempts": [item["attempt"] for item in items],
        "source_refs": [item["source_ref"] for item in items],
        "record_times_ms": [item["record_time_ms"] for item in items],
        "headers": headers,
    }
    doc["bindings"] = list(bindings)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("submit"), doc)
    return buf.getvalue()


def decode_items(data: bytes) -> list[Item]:
    """The items of one submit request."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("submit"), None)
    names = doc["bindings"]
    payloads: list[bytes | None] = doc["payloads"]
    keys: list[bytes | None] = doc["keys"]
    for i in doc["payload_nulls"]:
        payloads[i] = None
    for i in doc["key_nulls"]:
        keys[i] = None
    headers: list[list[Header]] = [[] for _ in payloads]
    for h in doc["headers"]:
        headers[h["item"]].append({"name": h["name"], "value": h["value"]})
    return [
        {"id": ident, "binding": names[b], "payload": payload, "key": key, "headers": hs,
         "attempt": attempt, "source_ref": ref, "record_time_ms": at}
        for ident, b, payload, key, hs, attempt, ref, at in zip(
            doc["ids"], doc["binding_of"], payloads, keys, headers, doc["attempts"],
            doc["source_refs"], doc["record_times_ms"], strict=True)
    ]


def encode_outcomes(outcomes: list[Outcome]) -> bytes:
    """One submit response as bytes: the ok ids, then every other outcome in full."""
    ok_ids = [o["id"] for o in outcomes if o["status"] == "ok"]
    others = [o for o in outcomes if o["status"] != "ok"] if len(ok_ids) < len(outcomes) else []
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("outcomes"), {"ok_ids": ok_ids, "others": others})
    return buf.getvalue()


def decode_outcomes(data: bytes) -> list[Outcome]:
    """The outcomes of one submit response."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("outcomes"), None)
    outcomes: list[Outcome] = [
        {"id": i, "status": "ok", "after_s": None, "error": None, "spends_attempt": True}
        for i in doc["ok_ids"]]
    outcomes += doc["others"]
    return outcomes

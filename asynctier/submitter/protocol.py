"""The Submitter's wire: Avro ``schemas/workloads.avsc`` in, ``workload_results.avsc`` out.

The method name carries the version of the two schemas (as the scheduler's submit call
does): a client and a Submitter built from other schemas get UNIMPLEMENTED, never garbage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from asynctier.platform.schemas import schema_json
from asynctier.platform.wire import fingerprint
from asynctier.queue.items import ON_PARENT_FAILURE  # in the order of the schema's enum

SERVICE = "asynctier.Submitter"
VERSION = fingerprint([schema_json("workloads"), schema_json("workload_results")])
METHOD = f"/{SERVICE}/SubmitWorkloadsV{VERSION}"
#: Trailing metadata key of a RESOURCE_EXHAUSTED answer: milliseconds to wait.
RETRY_AFTER_KEY = "retry-after-ms"

WorkloadStatus = Literal["accepted", "duplicate", "invalid", "throttled"]
#: A parent of a queue workload: (topic, id); topic None: the binding's own topic.
Parent = tuple[str | None, str]


class Workload(NamedTuple):
    """One workload: a payload with the fields its binding's source takes.

    (A named tuple, not a dataclass: a busy Submitter builds one per workload, and a
    frozen dataclass took five times as long to build.)"""

    payload: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    priority: int | None = None
    delay_ms: int | None = None
    id: str | None = None
    after: tuple[Parent, ...] = ()
    on_parent_failure: str | None = None


class Result(NamedTuple):
    """What became of one workload (``position``: its place in the call)."""

    status: WorkloadStatus
    position: int = 0
    id: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    reason: str | None = None
    retry_after_ms: int | None = None

    @property
    def ok(self) -> bool:
        """Accepted or duplicate: the workload is in the source."""
        return self.status in ("accepted", "duplicate")


@dataclass(frozen=True)
class Call:
    """One SubmitWorkloads call."""

    binding: str
    workloads: list[Workload] = field(default_factory=list)
    all_or_nothing: bool = False


# The three codecs below are written by hand, byte for byte what fastavro writes and reads
# for the two schemas (property tests in tests/submitter/test_submitter_units.py hold them equal):
# fastavro's generic path was most of a busy Submitter's time (``bench/submitter.py``;
# figures in bench/RESULTS.md).

def encode_call(call: Call) -> bytes:
    """A call's request bytes."""
    out = [_string(call.binding), b"\x01" if call.all_or_nothing else _NULL]
    if call.workloads:
        out.append(_varint(len(call.workloads)))
    for w in call.workloads:
        out.append(_NULL if w.payload is None else _SOME + _varint(len(w.payload)))
        if w.payload is not None:
            out.append(w.payload)
        out.append(_NULL if w.key is None else _SOME + _varint(len(w.key)) + w.key)
        if w.headers:
            out.append(_varint(len(w.headers)))
            for name, value in w.headers:
                out.append(_string(name))
                out.append(_NULL if value is None else _SOME + _varint(len(value)) + value)
        out.append(_NULL)  # the end of the headers' array (or its empty block)
        out.append(_NULL if w.priority is None else _SOME + _varint(w.priority))
        out.append(_NULL if w.delay_ms is None else _SOME + _varint(w.delay_ms))
        out.append(_NULL if w.id is None else _SOME + _string(w.id))
        if w.after:
            out.append(_varint(len(w.after)))
            for topic, ident in w.after:
                out.append(_NULL if topic is None else _some_string(topic))
                out.append(_string(ident))
        out.append(_NULL)  # the end of the parents' array (or its empty block)
        out.append(_NULL if w.on_parent_failure is None else _SOME + _on_failure_symbol(w))
    out.append(_NULL)
    return b"".join(out)


def _on_failure_symbol(w: Workload) -> bytes:
    if w.on_parent_failure not in ON_PARENT_FAILURE:
        raise ValueError(f"on_parent_failure {w.on_parent_failure!r} is not one of "
                         f"{', '.join(ON_PARENT_FAILURE)}")
    return _varint(ON_PARENT_FAILURE.index(w.on_parent_failure))


def decode_call(data: bytes) -> Call:
    """A call from its request bytes (ValueError when they are not one)."""
    try:
        return _read_call(data)
    except (ValueError, IndexError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"the request is not a SubmitWorkloads call: {exc}") from exc


def _read_call(data: bytes) -> Call:
    raw, pos = _bytes(data, 0)
    binding = raw.decode()
    flag = data[pos]
    if flag > 1:
        raise ValueError(f"byte {pos}: {flag} is not a boolean")
    workloads: list[Workload] = []
    append = workloads.append
    n, pos = _count(data, pos + 1)
    while n:
        for _ in range(n):
            payload, pos = _opt_bytes(data, pos)
            # the fields most workloads leave out: null (or no headers) read in place
            if data[pos]:
                key, pos = _opt_bytes(data, pos)
            else:
                key, pos = None, pos + 1
            if data[pos]:
                headers, pos = _headers(data, pos)
            else:
                headers, pos = (), pos + 1
            priority, pos = _opt_long(data, pos)
            if data[pos]:
                delay_ms, pos = _opt_long(data, pos)
            else:
                delay_ms, pos = None, pos + 1
            ident, pos = _opt_bytes(data, pos)
            if data[pos]:
                after, pos = _parents(data, pos)
            else:
                after, pos = (), pos + 1
            on_failure, pos = _on_parent_failure(data, pos)
            append(Workload(payload, key, headers, priority, delay_ms,
                            None if ident is None else ident.decode(), after, on_failure))
        n, pos = _count(data, pos)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} byte(s) after the call's end")
    return Call(binding, workloads, flag == 1)


def _headers(data: bytes, pos: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    n, pos = _count(data, pos)
    if not n:
        return (), pos
    headers = []
    while n:
        for _ in range(n):
            name, pos = _bytes(data, pos)
            value, pos = _opt_bytes(data, pos)
            headers.append((name.decode(), value))
        n, pos = _count(data, pos)
    return tuple(headers), pos


def _parents(data: bytes, pos: int) -> tuple[tuple[Parent, ...], int]:
    n, pos = _count(data, pos)
    parents: list[Parent] = []
    while n:
        for _ in range(n):
            topic, pos = _opt_bytes(data, pos)
            ident, pos = _bytes(data, pos)
            parents.append((None if topic is None else topic.decode(), ident.decode()))
        n, pos = _count(data, pos)
    return tuple(parents), pos


def _on_parent_failure(data: bytes, pos: int) -> tuple[str | None, int]:
    choice, pos = _opt_long(data, pos)
    if choice is None:
        return None, pos
    if not 0 <= choice < len(ON_PARENT_FAILURE):
        raise ValueError(f"byte {pos - 1}: {choice} is not a symbol of on_parent_failure")
    return ON_PARENT_FAILURE[choice], pos


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """Avro's int and long at ``pos``, and the position after it."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    n = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = data[pos]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos + 1
        shift += 7
        if shift > 63:
            raise ValueError(f"byte {pos}: a number longer than 10 bytes")


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _long(data, pos)
    end = pos + n
    if n < 0 or end > len(data):
        raise ValueError(f"byte {pos}: a length of {n}, past the end of the request")
    return data[pos:end], end


def _opt_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise ValueError(f"byte {pos}: {branch} is not a branch of ['null', 'bytes']")
    return _bytes(data, pos + 1)


def _opt_long(data: bytes, pos: int) -> tuple[int | None, int]:
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:
        raise ValueError(f"byte {pos}: {branch} is not a branch of ['null', 'long']")
    return _long(data, pos + 1)


def _count(data: bytes, pos: int) -> tuple[int, int]:
    """An array block's count (a negative count is followed by the block's size)."""
    n, pos = _long(data, pos)
    if n < 0:
        _, pos = _long(data, pos)
        n = -n
    return n, pos


def encode_results(results: list[Result]) -> bytes:
    """A reply's bytes (results in the order of the call)."""
    out = [_varint(len(results))] if results else []
    topics: dict[str, bytes] = {}  # a call's results share their topic
    for r in results:
        out.append(_STATUS[r.status])
        out.append(_NULL if r.id is None else _some_string(r.id))
        if r.topic is None:
            out.append(_NULL)
        else:
            topic = topics.get(r.topic)
            if topic is None:
                topic = topics[r.topic] = _some_string(r.topic)
            out.append(topic)
        out.append(_NULL if r.partition is None else _SOME + _varint(r.partition))
        out.append(_NULL if r.offset is None else _SOME + _varint(r.offset))
        out.append(_NULL if r.reason is None else _some_string(r.reason))
        out.append(_NULL if r.retry_after_ms is None else _SOME + _varint(r.retry_after_ms))
    out.append(_NULL)  # the end of the array's one block
    return b"".join(out)


_NULL = b"\x00"  # a union's branch 0 (null), a block count of 0, or false
_SOME = b"\x02"  # a union's branch 1
_STATUSES: tuple[WorkloadStatus, ...] = ("accepted", "duplicate", "invalid", "throttled")
_STATUS = {status: bytes([2 * i]) for i, status in enumerate(_STATUSES)}


def _varint(n: int) -> bytes:
    """Avro's int and long: zigzag, then 7 bits a byte, low first."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _some_string(text: str) -> bytes:
    data = text.encode()
    return _SOME + _varint(len(data)) + data


def _string(text: str) -> bytes:
    data = text.encode()
    return _varint(len(data)) + data


def decode_results(data: bytes) -> list[Result]:
    """The results of a reply, each with its position (ValueError when it is not one)."""
    try:
        return _read_results(data)
    except (ValueError, IndexError) as exc:
        raise ValueError(f"the reply is not a SubmitWorkloads answer: {exc}") from exc


def _read_results(data: bytes) -> list[Result]:
    results: list[Result] = []
    n, pos = _count(data, 0)
    while n:
        for _ in range(n):
            status, pos = _long(data, pos)
            if not 0 <= status < len(_STATUSES):
                raise ValueError(f"byte {pos - 1}: {status} is not a status")
            ident, pos = _opt_bytes(data, pos)
            topic, pos = _opt_bytes(data, pos)
            partition, pos = _opt_long(data, pos)
            offset, pos = _opt_long(data, pos)
            reason, pos = _opt_bytes(data, pos)
            retry, pos = _opt_long(data, pos)
            results.append(Result(
                _STATUSES[status], len(results), None if ident is None else ident.decode(),
                None if topic is None else topic.decode(), partition, offset,
                None if reason is None else reason.decode(), retry))
        n, pos = _count(data, pos)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} byte(s) after the reply's end")
    return results

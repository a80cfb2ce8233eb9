"""The run stream: long work accepted at once, each item's outcome reported as it ends.

A bidirectional gRPC call beside the unary submit (:mod:`asynctier.platform.rpc`), for the
bindings whose items are long work (every queue binding: docs/design.md, Long work). The
tailer opens one stream per leased batch and sends its items (and the checkpoints they
resume from) in one ``items`` message; the scheduler answers, on the same stream:

* ``alive``: the ids of the items it still holds (queued or running), every
  ``heartbeat_ms``; the tailer extends their leases. No heartbeat, no extension: the lease
  runs out and the item is leased again elsewhere.
* ``checkpoint``: a function saved its progress; the tailer stores it on the item's row
  and answers ``saved`` (its ``error`` empty when written); ``ctx.checkpoint`` returns then.
* ``outcomes``: the outcomes of the items that just ended (one or more), as they end.

The stream ends once every item has its outcome. Messages are ``schemas/stream.avsc``;
the method's name carries the fingerprint of the three schemas it uses, as the submit
method's does.
"""

from __future__ import annotations

import io
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import fastavro
import grpc

from asynctier.platform.errors import BadReply
from asynctier.platform.replies import read_outcomes
from asynctier.platform.schemas import load_schema, schema_json
from asynctier.platform.wire import Outcome, _pack, _unpack, fingerprint

log = logging.getLogger(__name__)

Kind = Literal["items", "outcomes", "alive", "checkpoint", "saved", "end"]

STREAM_VERSION = fingerprint([schema_json("submit"), schema_json("outcomes"),
                              schema_json("stream")])
#: The run stream's gRPC method (the unary call's is ``rpc.SUBMIT``).
RUN_STREAM = f"/asynctier.Scheduler/RunV{STREAM_VERSION}"


@dataclass
class Message:
    """One message of the stream (see ``schemas/stream.avsc``); ``end`` is never sent: it
    is what the tailer's reader makes of the stream's end (``error`` set when it broke)."""

    kind: Kind
    body: bytes = b""
    ids: list[int] = field(default_factory=list)
    resume: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    heartbeat_ms: int = 0
    seq: int = 0
    item: int = 0
    state_kind: str = ""
    state: bytes = b""
    error: str = ""
    code: grpc.StatusCode | None = None  # end: the gRPC status when the stream broke
    outcomes: list[Outcome] = field(default_factory=list)  # outcomes: the body, checked


def encode(message: Message) -> bytes:
    """A message as bytes."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("stream"), {
        "kind": message.kind, "body": message.body, "ids": _pack("q", message.ids),
        "resume": [{"item": i, "kind": k, "state": s} for i, (k, s) in message.resume.items()],
        "heartbeat_ms": message.heartbeat_ms, "seq": message.seq, "item": message.item,
        "state_kind": message.state_kind, "state": message.state, "error": message.error})
    return buf.getvalue()


def decode(data: bytes) -> Message:
    """A message from its bytes."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("stream"), None)
    return Message(kind=doc["kind"], body=doc["body"], ids=_unpack("q", doc["ids"]),
                   resume={r["item"]: (r["kind"], r["state"]) for r in doc["resume"]},
                   heartbeat_ms=doc["heartbeat_ms"], seq=doc["seq"], item=doc["item"],
                   state_kind=doc["state_kind"], state=doc["state"], error=doc["error"])


def items_message(request: bytes, resume: dict[int, tuple[str, bytes]],
                  heartbeat_s: float) -> bytes:
    """The stream's first message: a submit request, its checkpoints, the beat wanted."""
    return encode(Message("items", body=request, resume=resume,
                          heartbeat_ms=max(1, round(heartbeat_s * 1000))))


Event = tuple["StreamCall", Message]


class Events(Protocol):
    """Where a stream's reader puts its messages (a ``queue.Queue``, which may take other
    things too)."""

    def put(self, item: Event) -> None:
        """Take one message."""
        ...


class StreamCall:
    """The tailer's side of one run stream: a reader thread puts every message it gets on
    ``events`` as ``(call, message)``, then an ``end`` message (its ``error`` set when the
    stream broke: the scheduler died, or could not be reached, or sent a bad message).

    An ``outcomes`` message is read and checked here
    (:func:`~asynctier.platform.replies.read_outcomes`: each item of the stream answered
    once at most, known statuses, reasons and delays) into its ``outcomes``. A message
    that does not decode or fails a check breaks the stream, like a scheduler that died:
    nothing is resolved on its word, and its items run again once their leases run out."""

    def __init__(self, address: str, stub: Any, first: bytes,
                 events: Events, items: Sequence[Any]) -> None:
        self.address = address
        self.items = list(items)  # the source's records; message ids are positions here
        self.accepted = False  # a message came back: the scheduler holds the items
        self._waiting = set(range(len(self.items)))  # positions without an outcome yet
        self._events = events
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self._requests.put(first)
        self._call = stub(iter(self._requests.get, None), wait_for_ready=False)
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"asynctier-stream-{address}")
        self._reader.start()

    def _read(self) -> None:
        end = Message("end")
        try:
            for data in self._call:
                self.accepted = True
                self._events.put((self, self._message(data)))
        except grpc.RpcError as exc:
            end.code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            end.error = (exc.details() if hasattr(exc, "details") else None) or str(exc)
        except Exception as exc:  # a bad message: the stream is no good
            log.error("scheduler %s sent a bad message on a run stream of %d item(s): %s. "
                      "Nothing is done on its word: the stream is dropped and its items run "
                      "again once their leases run out. Check that %s is an asynctier "
                      "scheduler of this version and read its log.", self.address,
                      len(self.items), exc, self.address)
            self._call.cancel()
            end.code, end.error = grpc.StatusCode.INTERNAL, f"bad message: {exc}"
        finally:
            self._requests.put(None)  # ends the request side too
        self._events.put((self, end))

    def _message(self, data: bytes) -> Message:
        """One message from the scheduler, read and (``outcomes``) checked; BadReply or
        a decoding error when it is no good."""
        try:
            message = decode(data)
        except Exception as exc:
            raise BadReply(f"a message does not decode ({type(exc).__name__}: "
                           f"{str(exc)[:80]})") from None
        if message.kind == "outcomes":
            message.outcomes = read_outcomes(message.body, self._waiting, whole=False)
            self._waiting.difference_update(o["id"] for o in message.outcomes)
        return message

    def send(self, message: Message) -> None:
        """Send one message to the scheduler (a ``saved`` answer)."""
        self._requests.put(encode(message))

    def cancel(self) -> None:
        """Drop the stream (the scheduler stops the items it has not run)."""
        self._call.cancel()

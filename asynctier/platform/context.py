"""The ``ctx`` argument every function receives, and its checkpoints."""

from __future__ import annotations

import json
from typing import Any, Protocol

from asynctier.platform.errors import CheckpointError

#: The largest checkpoint a function may save (64 KiB): a checkpoint says how far the work
#: got (an offset, a page, a few ids), not its results; put those elsewhere.
MAX_CHECKPOINT_BYTES = 64 * 1024
NO_CHECKPOINTS = ("binding {binding}: its items cannot be checkpointed here (only the items of "
                  "a queue binding, which runs them as long work, keep checkpoints); bind the "
                  "function with --queue to save progress")


class Saver(Protocol):
    """Where a running item's checkpoints go (the scheduler's stream to the tailer)."""

    def save(self, state: bytes, kind: str) -> None:
        """Block until ``state`` is durable (from a worker thread)."""
        ...

    async def asave(self, state: bytes, kind: str) -> None:
        """Return once ``state`` is durable (from the event loop)."""
        ...


def encode_checkpoint(binding: str, state: Any) -> tuple[bytes, str]:
    """``state`` as (bytes, kind): bytes as they are, anything else as JSON; CheckpointError
    when it is not JSON-able or larger than :data:`MAX_CHECKPOINT_BYTES`."""
    if isinstance(state, bytes | bytearray | memoryview):
        data, kind = bytes(state), "bytes"
    else:
        try:
            data, kind = json.dumps(state, separators=(",", ":")).encode(), "json"
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"binding {binding}: the checkpoint is not JSON-able ({exc}); "
                                  "save bytes, or lists, dicts, strings and numbers") from exc
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"binding {binding}: the checkpoint takes {len(data):,} bytes, over "
                              f"the {MAX_CHECKPOINT_BYTES:,}-byte limit; save how far the work "
                              "got (an offset, a page), and its results elsewhere")
    return data, kind


def decode_checkpoint(data: bytes | None, kind: str | None) -> Any:
    """A stored checkpoint back as the function saved it (None: none)."""
    if data is None:
        return None
    return json.loads(data) if kind == "json" else data


class Context:
    """What a function may know about the record it runs on.

    ``binding`` and ``tenant`` name the binding; ``key`` and ``headers`` are the record's
    (a header value may be None); ``source`` is the record's position as text
    (``topic/partition/offset`` for Kafka); ``attempt`` counts from 1; ``record_time`` and
    ``deadline`` are epoch seconds (the function should be done by ``deadline``).
    ``resumed`` is the state the last attempt of this item saved with :meth:`checkpoint`
    (None when it saved none): a function that finds one continues from there. ``trace``
    is the OpenTelemetry context of this attempt while tracing is on (None otherwise); it
    is the current context while the function runs, so spans it starts nest there.

    A plain class with slots, not a dataclass: one is built per item on the hot path.
    """

    __slots__ = ("_saver", "attempt", "binding", "deadline", "headers", "key", "record_time",
                 "resumed", "source", "tenant", "trace")

    def __init__(self, binding: str, key: bytes | None,
                 headers: tuple[tuple[str, bytes | None], ...], source: str, attempt: int,
                 record_time: float, deadline: float, tenant: str = "default",
                 resumed: Any = None, saver: Saver | None = None, trace: Any = None) -> None:
        self.binding = binding
        self.key = key
        self.headers = headers
        self.source = source
        self.attempt = attempt
        self.record_time = record_time
        self.deadline = deadline
        self.tenant = tenant
        self.resumed = resumed
        self._saver = saver
        self.trace = trace

    def header(self, name: str) -> bytes | None:
        """The value of the first header called ``name`` (None when absent)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def checkpoint(self, state: Any) -> None:
        """Save progress: ``state`` (bytes, or anything JSON-able, at most
        :data:`MAX_CHECKPOINT_BYTES`) is durable when this returns, and a later attempt
        of this item gets it as ``ctx.resumed``. For sync functions; an async function
        awaits :meth:`acheckpoint`. Raises CheckpointError when it could not be saved
        (the item's lease was lost: stop, another attempt runs it)."""
        data, kind = encode_checkpoint(self.binding, state)
        self._need_saver().save(data, kind)

    async def acheckpoint(self, state: Any) -> None:
        """:meth:`checkpoint` for an async function."""
        data, kind = encode_checkpoint(self.binding, state)
        await self._need_saver().asave(data, kind)

    def _need_saver(self) -> Saver:
        if self._saver is None:
            raise CheckpointError(NO_CHECKPOINTS.format(binding=self.binding))
        return self._saver

    def __repr__(self) -> str:
        return (f"Context(binding={self.binding!r}, source={self.source!r}, "
                f"attempt={self.attempt}, key={self.key!r})")

"""Building one submit call, and reading its answer: the same for every caller (the tailer
pipeline, ``dlq replay``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from asynctier.platform import wire
from asynctier.platform.rpc import MAX_CALL_BYTES, header_bytes
from asynctier.platform.wire import Outcome

log = logging.getLogger(__name__)


class CallBuilder:
    """Builds one submit request of at most :data:`MAX_CALL_BYTES` of record bytes: the
    first record that would take it past the cap is refused (a single larger record goes
    alone). The one place a call is cut by size."""

    def __init__(self, cap: int | None = None) -> None:
        self.columns = wire.Columns()
        self.cap = MAX_CALL_BYTES if cap is None else cap
        self.size = 0

    def add(self, binding: str, payload: bytes | None, key: bytes | None,
            headers: Sequence[tuple[str, bytes | None]] | None, attempt: int,
            source_ref: str, record_time_ms: int, priority: int = 0,
            deadline_ms: int | None = None) -> bool:
        """Add one item; False (and nothing added) when the call is full."""
        size = self.size + (len(payload) if payload else 0) + (len(key) if key else 0)
        if headers:
            size += header_bytes(headers)
        if size > self.cap and len(self.columns):
            return False
        self.size = size
        self.columns.add(binding, payload, key, headers, attempt, source_ref, record_time_ms,
                         priority, deadline_ms)
        return True

    def __len__(self) -> int:
        return len(self.columns)

    def encode(self) -> bytes:
        """The request's bytes."""
        return self.columns.encode()


def complete(outcomes: list[Outcome], n: int) -> list[Outcome]:
    """One outcome per item ``0..n-1``: an item the scheduler said nothing about is
    unknown, so it is retried, never taken as done."""
    if len(outcomes) == n and len({o["id"] for o in outcomes}) == n:
        return outcomes
    by_id = {o["id"]: o for o in outcomes if 0 <= o["id"] < n}
    missing = [wire.retry(i, "the scheduler returned no outcome for this item")
               for i in range(n) if i not in by_id]
    log.error("a scheduler answered %d outcome(s) for %d item(s); retrying %d unknown",
              len(outcomes), n, len(missing))
    return list(by_id.values()) + missing

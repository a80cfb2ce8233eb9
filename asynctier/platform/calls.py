"""Building one submit call: the same for every caller (the tailer pipeline, the delay
tailers, the parked-key runner, ``dlq replay``). Its answer is read, and checked, by
:mod:`asynctier.platform.replies`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from asynctier.platform import tracing, wire
from asynctier.platform.rpc import MAX_CALL_BYTES, header_bytes


class CallBuilder:
    """Builds one submit request of at most :data:`MAX_CALL_BYTES` of record bytes: the
    first record that would take it past the cap is refused (a single larger record goes
    alone). The one place a call is cut by size."""

    def __init__(self, cap: int | None = None) -> None:
        self.columns = wire.Columns()
        self.cap = MAX_CALL_BYTES if cap is None else cap
        self.size = 0
        #: While tracing is on: what each item's ``read`` span needs (tracing_read.Read).
        self.reads: list[Any] | None = [] if tracing.enabled() else None

    def add(self, binding: str, payload: bytes | None, key: bytes | None,
            headers: Sequence[tuple[str, bytes | None]] | None, attempt: int,
            source_ref: str, record_time_ms: int, priority: int = 0,
            deadline_ms: int | None = None, fresh: bool = False) -> bool:
        """Add one item (``fresh``: no copy of it was sent before); False (and nothing
        added) when the call is full."""
        size = self.size + (len(payload) if payload else 0) + (len(key) if key else 0)
        if headers:
            size += header_bytes(headers)
        if size > self.cap and len(self.columns):
            return False
        self.size = size
        self.columns.add(binding, payload, key, headers, attempt, source_ref, record_time_ms,
                         priority, deadline_ms, fresh)
        if self.reads is not None:
            self.reads.append((binding, headers or (), source_ref, attempt, time.time_ns()))
        return True

    def __len__(self) -> int:
        return len(self.columns)

    def encode(self) -> bytes:
        """The request's bytes (and, while tracing is on, its items' ``read`` spans)."""
        if self.reads:
            from asynctier.platform.tracing_read import read_spans  # OpenTelemetry: when on

            read_spans(self.reads, time.time_ns())
        return self.columns.encode()


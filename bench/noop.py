"""The functions asynctier runs in the benchmarks (bound as ``bench.noop:<name>``).

``noop`` does nothing; ``fail`` always raises (the retry flood); ``timed`` records
record-to-start latency: now minus the record's producer time ``t0``, in milliseconds,
appended with ``t0`` as a line ``<t0> <ms>`` to the file named by ``BENCH_LATENCY_FILE``
(buffered, written every half second and at exit).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

from bench.kafka_loops import noop as _noop

FLUSH_S = 0.5


def noop(payload: Any, ctx: Any) -> None:
    """Do nothing with the decoded record."""
    _noop(payload)


def fail(payload: Any, ctx: Any) -> None:
    """Fail every time (a plain exception: it retries along the ladder)."""
    raise RuntimeError("bench: this function always fails")


class _Samples:
    """Latency samples of this process, written out in batches."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        self.last_flush = time.monotonic()

    def add(self, t0: float, ms: float) -> None:
        with self.lock:
            self.pending.append((t0, ms))
        if time.monotonic() - self.last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        path = os.environ.get("BENCH_LATENCY_FILE")
        with self.lock:
            taken, self.pending = self.pending, []
            self.last_flush = time.monotonic()
        if path and taken:
            with open(path, "a") as fh:
                fh.write("".join(f"{t0:.6f} {ms:.3f}\n" for t0, ms in taken))


_SAMPLES = _Samples()
atexit.register(_SAMPLES.flush)


def timed(payload: Any, ctx: Any) -> None:
    """Record now - ``payload["t0"]`` (ms); records marked ``warmup`` are skipped."""
    started = time.time()
    if not payload.get("warmup"):
        t0 = payload["t0"]
        _SAMPLES.add(t0, (started - t0) * 1000.0)

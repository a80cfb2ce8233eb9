"""The functions asynctier runs in the benchmarks (bound as ``bench.noop:<name>``).

``noop`` does nothing; ``fail`` always raises (the retry flood); ``timed`` records
record-to-start latency: now minus the record's producer time ``t0``, in milliseconds,
written with ``t0`` and the producer's own lateness as a line ``<t0> <ms> <produced_ms>`` to
the file named by ``BENCH_LATENCY_FILE`` when the process exits.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from array import array
from typing import Any

from bench.kafka_loops import fail as _fail
from bench.kafka_loops import noop as _noop
from bench.work import asleep_1ms, sleep_1ms


def noop(payload: Any, ctx: Any) -> None:
    """Do nothing with the decoded record."""
    _noop(payload)


def fail(payload: Any, ctx: Any) -> None:
    """Fail every time (a plain exception: it retries along the ladder)."""
    _fail(payload)


class _Samples:
    """Latency samples of this process, kept in flat arrays and written out at exit.

    Nothing is written while the run goes on: formatting and writing thousands of lines
    inside the measured function would hold its worker (and the GIL) for milliseconds and
    show up in the very tail being measured.
    """

    def __init__(self) -> None:
        self.t0 = array("d")
        self.ms = array("d")
        self.produced_ms = array("d")
        self.lock = threading.Lock()

    def add(self, t0: float, ms: float, produced_ms: float) -> None:
        with self.lock:
            self.t0.append(t0)
            self.ms.append(ms)
            self.produced_ms.append(produced_ms)

    def flush(self) -> None:
        path = os.environ.get("BENCH_LATENCY_FILE")
        with self.lock:
            rows = zip(self.t0, self.ms, self.produced_ms, strict=True)
            if path and len(self.t0):
                with open(path, "a") as fh:
                    fh.write("".join(f"{t0:.6f} {ms:.3f} {p:.3f}\n" for t0, ms, p in rows))
            self.t0, self.ms, self.produced_ms = array("d"), array("d"), array("d")


_SAMPLES = _Samples()
atexit.register(_SAMPLES.flush)


def timed(payload: Any, ctx: Any) -> None:
    """Record now - ``payload["t0"]`` (ms), and how late the producer was (the record's
    timestamp - ``t0``, ms); records marked ``warmup`` are skipped."""
    started = time.time()
    if not payload.get("warmup"):
        t0 = payload["t0"]
        _SAMPLES.add(t0, (started - t0) * 1000.0, (ctx.record_time - t0) * 1000.0)


def sleep1ms(payload: Any, ctx: Any) -> None:
    """Wait 1 ms on (simulated) I/O, synchronously: runs in the scheduler's thread pool."""
    sleep_1ms(payload)


async def asleep1ms(payload: Any, ctx: Any) -> None:
    """Wait 1 ms on (simulated) I/O, asynchronously: runs on the scheduler's event loop."""
    await asleep_1ms(payload)


async def atimed(payload: Any, ctx: Any) -> None:
    """:func:`timed` as an ``async def`` (runs on the scheduler's event loop)."""
    timed(payload, ctx)


def sleep2ms(payload: Any, ctx: Any) -> None:
    """Wait 2 ms on (simulated) I/O, synchronously: the urgency bench's batch backlog."""
    time.sleep(0.002)


def burn(payload: Any, ctx: Any) -> None:
    """Keep the CPU busy for 0.2 ms (holds the GIL): the CPU-bound batch backlog."""
    end = time.perf_counter() + 0.0002
    while time.perf_counter() < end:
        pass

"""What the run-once guard adds to record-to-start inside the scheduler, without Kafka.

    python -m bench.guard_latency [--rate 20000] [--seconds 5] [--rounds 3]

One process: records due at ``--rate`` per second (open loop: each carries the time it was
due), sent as a tailer sends them (at most 4 batches under way; a batch leaves at 1,000
records, at once when nothing is under way, else when its first record has waited 5 ms)
to a Scheduler on the same event loop (the real dispatch, the real Redis). The function
notes now minus the due time when it starts. Each round runs the binding as bound by
default (run-once guard on) and bound ``--idempotent``, every other round in reverse
order, each on a fresh scheduler and binding. Prints each run's p50/p99 and, per round,
guard p99 / idempotent p99; the last line reads ``guard_p99_ratio=<median>``.

With no Kafka, no tailer process and no RPC, the difference between the two is the
guard's own: the claim before a batch runs, the write-down after a chunk ran. The full
record-to-start against the raw loop is ``bench/run.py --only latency``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from asynctier.dev.testing import start_test_redis
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.binding_source import StaticBindings
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item
from asynctier.scheduler import FunctionResolver, Scheduler
from asynctier.scheduler.limits import RedisAdmission
from asynctier.scheduler.runtime import Runtime

BATCH = 1000
IN_FLIGHT = 4
LINGER_S = 0.005
PARTITIONS = 4

#: record-to-start samples (ms) of the run under way
SAMPLES: list[float] = []


def started(payload: Any, ctx: Any) -> None:
    """Note how late this record started (ms after it was due)."""
    SAMPLES.append((time.time() - payload["t0"]) * 1000.0)


def _items(binding: str, first: int, due: list[float]) -> list[Item]:
    return [{"id": n, "binding": binding, "payload": json.dumps({"t0": t0}).encode(),
             "key": None, "headers": [], "attempt": 1,
             "source_ref": f"{binding}/{(first + n) % PARTITIONS}/{(first + n) // PARTITIONS}",
             "record_time_ms": int(t0 * 1000), "priority": 0, "deadline_ms": None}
            for n, t0 in enumerate(due)]


def _check(outcomes: list[Any]) -> None:
    bad = [o for o in outcomes if o["status"] != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} record(s) did not succeed, e.g. {bad[0]}")


async def _drive(scheduler: Scheduler, binding: str, rate: float, seconds: float,
                 first: int = 0) -> int:
    """Send the records as they fall due, as a tailer batches them (their offsets from
    ``first`` on); the offset after the last."""
    total = int(rate * seconds)
    start = time.time()
    made = 0
    pending: list[float] = []
    in_flight: deque[asyncio.Task[Any]] = deque()
    sent = 0
    while sent < total or in_flight:
        while in_flight and in_flight[0].done():
            _check(in_flight.popleft().result())
        due_now = min(total, int((time.time() - start) * rate))
        pending += [start + n / rate for n in range(made, due_now)]
        made = due_now
        if pending and len(in_flight) < IN_FLIGHT and (
                len(pending) >= BATCH or not in_flight
                or time.time() - pending[0] >= LINGER_S):
            batch, pending = pending[:BATCH], pending[BATCH:]
            in_flight.append(asyncio.create_task(
                scheduler.process(_items(binding, first + sent, batch))))
            sent += len(batch)
        await asyncio.sleep(0.0005)
    return first + sent


async def _run(settings: Settings, rate: float, seconds: float, idempotent: bool) -> list[float]:
    name = f"lat{uuid.uuid4().hex[:6]}"
    binding = Binding(name, Source("kafka", name), "bench.guard_latency:started",
                      execution=Execution(idempotent=idempotent, timeout_s=5.0))
    admission = RedisAdmission(settings)
    scheduler = Scheduler(StaticBindings([binding]), Runtime(FunctionResolver(("bench",)), 8),
                          admission, guard=admission.guard)
    scheduler.start()
    try:
        offset = await _drive(scheduler, name, rate, 0.5)  # warm-up: chunk sizes learned
        SAMPLES.clear()
        await _drive(scheduler, name, rate, seconds, offset)
        return sorted(SAMPLES)
    finally:
        await scheduler.stop()
        await admission.close()


def _pct(samples: list[float], p: float) -> float:
    return samples[min(len(samples) - 1, int(len(samples) * p / 100))]


def main() -> None:
    """Run the rounds and print the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=20_000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="asynctier-guard-latency-") as tmp:
        redis = start_test_redis(Path(tmp))
        settings = dataclasses.replace(Settings.load(None), redis_url=redis.url)
        try:
            _rounds(settings, args, ratios)
        finally:
            redis.stop()
    print(f"guard_p99_ratio={statistics.median(ratios):.2f}")


def _rounds(settings: Settings, args: argparse.Namespace, ratios: list[float]) -> None:
    """The rounds, each guard and --idempotent, every other one in reverse order."""
    for round_ in range(args.rounds):
        p99: dict[str, float] = {}
        kinds = [False, True] if round_ % 2 == 0 else [True, False]
        for idempotent in kinds:
            got = asyncio.run(_run(settings, args.rate, args.seconds, idempotent))
            kind = "idempotent" if idempotent else "guard"
            p99[kind] = _pct(got, 99)
            print(f"round {round_ + 1} {kind:10s} p50 {_pct(got, 50):7.1f} ms  p90 "
                  f"{_pct(got, 90):7.1f} ms  p99 {p99[kind]:7.1f} ms  ({len(got):,} "
                  "samples)", flush=True)
        ratios.append(p99["guard"] / p99["idempotent"])
        print(f"round {round_ + 1} guard p99 / idempotent p99 = {ratios[-1]:.2f}",
              flush=True)


if __name__ == "__main__":
    # the function runs from the module bench.guard_latency, not from __main__: its samples
    # are that module's
    from bench.guard_latency import main as module_main
    module_main()

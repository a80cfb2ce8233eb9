"""The scheduler's raw rate in-process: batches of no-op items over gRPC, and the core alone.

``python -m bench.scheduler_rate [--seconds S] [--core-only]`` prints these figures (they
assert nothing): items/s over gRPC (a sync no-op, batches of 1,000, 4 calls in flight),
items/s of the core without RPC or Avro (sync and async no-ops, then sync and async
functions that wait 1 ms: ``bench.noop:sleep1ms`` and ``asleep1ms``), and the wire's cost
per 1,000 items (Avro encode/decode on both sides). ``--core-only``: the core alone. It
uses the Redis at ``ASYNCTIER_REDIS_URL``, or starts one in a temporary folder. The
scheduler is built by the tests' harness (``tests/scheduler_harness.py``), so run it from
the repository root. What the scheduler does with these calls (every item answered once,
at most ``workers`` chunks at a time) is tested in
``tests/scheduler/test_scheduler_concurrency.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import threading
import time
import timeit
from collections.abc import Iterator
from pathlib import Path

from asynctier import dev as devstack
from asynctier.platform import wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item
from tests.scheduler_harness import items, local_scheduler, running_scheduler

BATCH = 1000
IN_FLIGHT = 4
NOOP = Binding("noop", Source("kafka", "t"), "tests.funcs.basic:noop")
ASYNC_NOOP = Binding("anoop", Source("kafka", "t"), "tests.funcs.basic:async_noop")
SLEEP = Binding("sleep", Source("kafka", "t"), "bench.noop:sleep1ms")
ASYNC_SLEEP = Binding("asleep", Source("kafka", "t"), "bench.noop:asleep1ms")
ALLOW = ("tests.funcs.basic", "bench.noop")


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """``ASYNCTIER_REDIS_URL``, or a Redis of this run's own, stopped at the end."""
    given = os.environ.get("ASYNCTIER_REDIS_URL")
    if given:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="asynctier-sched-rate-") as root:
        node = devstack.start_test_redis(Path(root))
        try:
            yield node.url
        finally:
            node.stop()


def over_grpc(settings: Settings, seconds: float) -> float:
    """Items/s of a sync no-op over gRPC, ``IN_FLIGHT`` batches of ``BATCH`` in flight."""
    with running_scheduler(settings, [NOOP]) as running:
        running.submit(items("noop", BATCH))  # warm up
        done = 0
        lock = threading.Lock()
        until = time.monotonic() + seconds

        def sender(k: int) -> None:
            nonlocal done
            batch: list[Item] = items("noop", BATCH, start=k * BATCH)
            while time.monotonic() < until:
                outcomes = running.client.submit(batch).result()
                assert len(outcomes) == BATCH
                with lock:
                    done += BATCH

        start = time.monotonic()
        threads = [threading.Thread(target=sender, args=(k,)) for k in range(IN_FLIGHT)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return done / (time.monotonic() - start)


def of_the_core(binding: Binding, seconds: float) -> tuple[float, float]:
    """Items/s of ``binding`` through ``Scheduler.process`` (no RPC, no Avro), as a run
    stream calls it (outcomes reported as each chunk ends), and the process's CPU
    microseconds per item over the same window (the figure a loaded machine moves least)."""
    def report(outcomes: list[wire.Outcome]) -> None:
        pass

    async def measure() -> tuple[float, float]:
        scheduler = local_scheduler([binding], allow=ALLOW)
        scheduler.start()
        for _ in range(3):  # warm up: the chunk sizer learns the binding's time per item
            await scheduler.process(items(binding.name, BATCH), report)
        done = 0
        start, cpu = time.monotonic(), time.process_time()
        while time.monotonic() - start < seconds:
            calls = [scheduler.process(items(binding.name, BATCH, start=k * BATCH), report)
                     for k in range(IN_FLIGHT)]
            done += sum(len(c) for c in await asyncio.gather(*calls))
        rate = done / (time.monotonic() - start)
        cpu_us = (time.process_time() - cpu) / done * 1e6
        await scheduler.stop()
        return rate, cpu_us

    return asyncio.run(measure())


def wire_costs() -> dict[str, float]:
    """Milliseconds per ``BATCH`` items of each wire step."""
    batch = items("noop", BATCH)
    data = wire.encode_items(batch)
    outs = [wire.ok(i["id"]) for i in batch]
    reply = wire.encode_outcomes(outs)
    steps = {
        "tailer encode_items": lambda: wire.encode_items(batch),
        "scheduler decode_items": lambda: wire.decode_items(data),
        "scheduler encode_outcomes": lambda: wire.encode_outcomes(outs),
        "tailer decode_outcomes": lambda: wire.decode_outcomes(reply),
    }
    return {name: min(timeit.repeat(step, number=5, repeat=2)) / 5 * 1000
            for name, step in steps.items()}


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="how long each rate is measured (default 2)")
    parser.add_argument("--core-only", action="store_true",
                        help="measure the core alone (no gRPC, no wire costs, no Redis)")
    args = parser.parse_args()
    if not args.core_only:
        with redis_url() as url:
            settings = Settings(redis_url=url, prefix=f"sched-rate-{os.getpid()}")
            rate = over_grpc(settings, args.seconds)
        print(f"scheduler over gRPC: {rate:,.0f} items/s (no-op sync function, batches of "
              f"{BATCH}, {IN_FLIGHT} calls in flight)")
    for label, pair in (("no-op", (NOOP, ASYNC_NOOP)), ("1 ms wait", (SLEEP, ASYNC_SLEEP))):
        (sync_rate, sync_cpu), (async_rate, async_cpu) = (of_the_core(b, args.seconds)
                                                          for b in pair)
        print(f"scheduler core (no RPC, no Avro), {label}: sync {sync_rate:,.0f} items/s "
              f"({sync_cpu:.0f} us CPU per item), async {async_rate:,.0f} items/s "
              f"({async_cpu:.0f} us CPU per item)")
    if args.core_only:
        return
    costs = wire_costs()
    for name, ms in costs.items():
        print(f"  {name}: {ms:.2f} ms per {BATCH} items")
    total = sum(costs.values())
    print(f"  wire total: {total:.2f} ms per {BATCH} items "
          f"(alone it caps one process at {BATCH / total * 1000:,.0f} items/s)")


if __name__ == "__main__":
    main()

"""The scheduler's raw rate in-process: batches of no-op items over gRPC, and the core alone.

``python -m bench.scheduler_rate [--seconds S]`` prints three figures (they assert
nothing): items/s over gRPC (a sync no-op, batches of 1,000, 4 calls in flight), items/s
of the core without RPC or Avro (sync and async no-ops), and the wire's cost per 1,000
items (Avro encode/decode on both sides). It uses the Redis at ``ASYNCTIER_REDIS_URL``, or
starts one in a temporary folder. The scheduler is built by the tests' harness
(``tests/scheduler_harness.py``), so run it from the repository root. What the scheduler
does with these calls (every item answered once, at most ``workers`` at a time) is
tested in ``tests/test_scheduler_concurrency.py``.
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
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item
from tests.scheduler_harness import items, local_scheduler, running_scheduler

BATCH = 1000
IN_FLIGHT = 4
NOOP = Binding("noop", "t", "tests.funcs.basic:noop")
ASYNC_NOOP = Binding("anoop", "t", "tests.funcs.basic:async_noop")


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


def of_the_core(binding: Binding, seconds: float) -> float:
    """Items/s of ``binding`` through ``Scheduler.process`` (no RPC, no Avro)."""
    async def measure() -> float:
        scheduler = local_scheduler([binding])
        scheduler.start()
        await scheduler.process(items(binding.name, BATCH))
        done = 0
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            calls = [scheduler.process(items(binding.name, BATCH, start=k * BATCH))
                     for k in range(IN_FLIGHT)]
            done += sum(len(c) for c in await asyncio.gather(*calls))
        rate = done / (time.monotonic() - start)
        await scheduler.stop()
        return rate

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
    args = parser.parse_args()
    with redis_url() as url:
        settings = Settings(redis_url=url, prefix=f"sched-rate-{os.getpid()}")
        rate = over_grpc(settings, args.seconds)
    print(f"scheduler over gRPC: {rate:,.0f} items/s (no-op sync function, batches of "
          f"{BATCH}, {IN_FLIGHT} calls in flight)")
    sync_rate, async_rate = of_the_core(NOOP, args.seconds), of_the_core(ASYNC_NOOP,
                                                                         args.seconds)
    print(f"scheduler core (no RPC, no Avro): sync no-op {sync_rate:,.0f} items/s, "
          f"async {async_rate:,.0f} items/s")
    costs = wire_costs()
    for name, ms in costs.items():
        print(f"  {name}: {ms:.2f} ms per {BATCH} items")
    total = sum(costs.values())
    print(f"  wire total: {total:.2f} ms per {BATCH} items "
          f"(alone it caps one process at {BATCH / total * 1000:,.0f} items/s)")


if __name__ == "__main__":
    main()

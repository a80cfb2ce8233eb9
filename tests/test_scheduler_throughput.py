"""Raw scheduler throughput in-process: batches of no-op items over gRPC.

Run it alone for the figure::

    ASYNCTIER_KAFKA_BOOTSTRAP=127.0.0.1:19092 ASYNCTIER_REDIS_URL=redis://127.0.0.1:16379/0 \\
        .venv/bin/python -m pytest tests/test_scheduler_throughput.py -s -q

(``SCHED_BENCH_S`` sets how long each measurement runs, 2 s by default.)
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item
from tests.scheduler_harness import items, local_scheduler, running_scheduler

SECONDS = float(os.environ.get("SCHED_BENCH_S", "2"))
BATCH = 1000
IN_FLIGHT = 4
NOOP = Binding("noop", "t", "tests.funcs.basic:noop")
ASYNC_NOOP = Binding("anoop", "t", "tests.funcs.basic:async_noop")


def test_throughput_over_grpc(settings: Settings) -> None:
    with running_scheduler(settings, [NOOP]) as running:
        running.submit(items("noop", BATCH))  # warm up
        done = 0
        lock = threading.Lock()
        until = time.monotonic() + SECONDS

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
        rate = done / (time.monotonic() - start)
    print(f"\nscheduler over gRPC: {rate:,.0f} items/s (no-op sync function, batches of "
          f"{BATCH}, {IN_FLIGHT} calls in flight, {done} items)")
    assert rate > 5_000  # loose: the printed figure is what matters


def test_throughput_of_the_core() -> None:
    async def measure(binding: Binding) -> float:
        scheduler = local_scheduler([binding])
        scheduler.start()
        await scheduler.process(items(binding.name, BATCH))
        done = 0
        start = time.monotonic()
        while time.monotonic() - start < SECONDS:
            calls = [scheduler.process(items(binding.name, BATCH, start=k * BATCH))
                     for k in range(IN_FLIGHT)]
            done += sum(len(c) for c in await asyncio.gather(*calls))
        rate = done / (time.monotonic() - start)
        await scheduler.stop()
        return rate

    sync_rate = asyncio.run(measure(NOOP))
    async_rate = asyncio.run(measure(ASYNC_NOOP))
    print(f"\nscheduler core (no RPC, no Avro): sync no-op {sync_rate:,.0f} items/s, "
          f"async {async_rate:,.0f} items/s")
    assert sync_rate > 15_000  # loose: the figure is what matters; CI machines vary


def test_where_the_time_goes_per_1000_items() -> None:
    """Prints the wire's share (Avro encode/decode on both sides) beside the core's."""
    import timeit

    from asynctier.platform import wire

    batch = items("noop", BATCH)
    data = wire.encode_items(batch)
    outs = [wire.ok(i["id"]) for i in batch]
    reply = wire.encode_outcomes(outs)
    costs = {
        "tailer encode_items": lambda: wire.encode_items(batch),
        "scheduler decode_items": lambda: wire.decode_items(data),
        "scheduler encode_outcomes": lambda: wire.encode_outcomes(outs),
        "tailer decode_outcomes": lambda: wire.decode_outcomes(reply),
    }
    print()
    total = 0.0
    for name, call in costs.items():
        ms = min(timeit.repeat(call, number=5, repeat=2)) / 5 * 1000
        total += ms
        print(f"  {name}: {ms:.2f} ms per {BATCH} items")
    print(f"  wire total: {total:.2f} ms per {BATCH} items "
          f"(alone it caps one process at {BATCH / total * 1000:,.0f} items/s)")

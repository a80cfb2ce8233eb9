"""Sharing the workers: bounded queue backpressure, priority tiers, tenant fairness.

These drive :meth:`Scheduler.process` on a loop of their own (the gRPC path is covered in
test_scheduler_outcomes.py) with a sync function that sleeps a little per item, so that
the timings measure the scheduling, not the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler import Scheduler, SchedulerOptions
from tests.funcs import basic
from tests.helpers import until
from tests.scheduler_harness import item, local_scheduler


def timed_items(binding: str, count: int, ms: float, start: int = 0) -> list[Item]:
    return [item(binding, start + n, json.dumps({"n": start + n, "ms": ms}).encode())
            for n in range(count)]


def test_a_full_queue_makes_submit_wait_and_the_cap_holds() -> None:
    gate = Binding("gate", Source("kafka", "t"), "tests.funcs.basic:sleepy")
    options = SchedulerOptions(workers=1, max_queued_items=100, max_chunk_items=16,
                               min_chunk_items=16)

    async def scenario() -> None:
        scheduler = local_scheduler([gate], options=options)
        scheduler.start()
        payload = json.dumps({"sleep": 0.002}).encode()
        calls = [asyncio.create_task(scheduler.process(
            [item("gate", c * 100 + n, payload) for n in range(100)])) for c in range(5)]
        peak = 0
        waited = False
        deadline = time.monotonic() + 60
        while not all(c.done() for c in calls):  # sampled every 5 ms until all are answered
            assert time.monotonic() < deadline, "500 items were not answered in 60 s"
            peak = max(peak, scheduler.queue.items)
            waited |= scheduler.queue.waiting_puts > 0
            await asyncio.sleep(0.005)
        assert waited, "no submit ever waited for room"
        assert peak <= 100 and scheduler.queue.peak_items <= 100
        outcomes = [o for c in calls for o in c.result()]
        assert len(outcomes) == 500 and all(o["status"] == "ok" for o in outcomes)
        await scheduler.stop()

    asyncio.run(scenario())


def test_urgent_starts_first_under_contention_and_batch_still_progresses() -> None:
    bindings = [Binding("urgent", Source("kafka", "t"), "tests.funcs.basic:timed", tenant="live",
                        priority="urgent"),
                Binding("batch", Source("kafka", "t"), "tests.funcs.basic:timed", tenant="suggest",
                        priority="batch")]
    basic.reset()

    async def scenario() -> tuple[float, float, int]:
        scheduler = local_scheduler(bindings, options=SchedulerOptions(workers=4))
        scheduler.start()
        start = time.monotonic()
        flood = asyncio.create_task(scheduler.process(timed_items("batch", 3000, 1.0)))
        await until(lambda: len(basic.STARTS.get("batch", [])) >= 100 and
                    scheduler.queue.items > 1000, message="the flood runs and is queued")
        trickle_waits: list[float] = []
        for wave in range(10):  # urgent arrives in small batches during the flood
            sent = time.monotonic()
            before = len(basic.STARTS.get("urgent", []))
            await scheduler.process(timed_items("urgent", 20, 1.0, start=wave * 20))
            mine = basic.STARTS["urgent"][before:]
            trickle_waits += [started - sent for _, started in mine]
            await asyncio.sleep(0.03)  # the next wave arrives a little later (the workload)
        assert not flood.done(), "the flood ended too soon to contend"
        await flood
        batch_waits = [s - start for _, s in basic.STARTS["batch"]]
        await scheduler.stop()
        return _p99(trickle_waits), _p99(batch_waits), len(trickle_waits)

    urgent_p99, batch_p99, urgent_count = asyncio.run(scenario())
    print(f"\nurgent p99 wait {urgent_p99 * 1000:.0f} ms over {urgent_count} items; "
          f"batch p99 wait {batch_p99 * 1000:.0f} ms over 3000 items")
    assert urgent_count == 200
    assert urgent_p99 <= batch_p99 / 5


def test_both_tiers_backlogged_share_8_to_1() -> None:
    bindings = [Binding("urgent", Source("kafka", "t"), "tests.funcs.basic:timed",
                        priority="urgent"),
                Binding("batch", Source("kafka", "t"), "tests.funcs.basic:timed", priority="batch")]
    basic.reset()

    async def scenario() -> None:
        scheduler = local_scheduler(bindings, options=SchedulerOptions(workers=4))
        scheduler.start()
        batch = asyncio.create_task(scheduler.process(timed_items("batch", 1500, 0.5)))
        urgent = asyncio.create_task(scheduler.process(timed_items("urgent", 1500, 0.5)))
        await asyncio.gather(batch, urgent)
        await scheduler.stop()

    asyncio.run(scenario())
    urgent_starts = sorted(s for _, s in basic.STARTS["urgent"])
    batch_starts = sorted(s for _, s in basic.STARTS["batch"])
    urgent_done = urgent_starts[-1]
    batch_meanwhile = sum(1 for s in batch_starts if s < urgent_done)
    print(f"\nwhile 1500 urgent items ran, {batch_meanwhile} batch items started")
    assert 1500 / 20 <= batch_meanwhile <= 1500 / 4  # about 1:8, never starved
    assert statistics.median(urgent_starts) < statistics.median(batch_starts)


def test_a_trickle_starts_on_the_spare_worker_without_waiting_for_a_flood_chunk() -> None:
    """One worker, held by tenant A's items of 200 ms each; tenant B's single items, sent
    one after the other, each start at once on the spare worker. Without it each would
    wait for A's running item to end (up to 200 ms; the first, for A's first chunk of
    four)."""
    bindings = [Binding("flood", Source("kafka", "t"), "tests.funcs.basic:timed", tenant="a"),
                Binding("trickle", Source("kafka", "t"), "tests.funcs.basic:timed", tenant="b")]
    basic.reset()

    async def scenario() -> tuple[list[float], bool]:
        scheduler = local_scheduler(bindings, options=SchedulerOptions(workers=1))
        scheduler.start()
        flood = asyncio.create_task(scheduler.process(timed_items("flood", 8, 200)))
        await until(lambda: "flood" in basic.STARTS, message="the flood runs")
        waits = []
        for n in range(6):
            sent = time.monotonic()
            outcomes = await scheduler.process(timed_items("trickle", 1, 1, start=n))
            assert [o["status"] for o in outcomes] == ["ok"]
            waits.append(basic.STARTS["trickle"][-1][1] - sent)
        flooding = not flood.done()
        await flood
        await scheduler.stop()
        return waits, flooding

    waits, flooding = asyncio.run(scenario())
    print(f"\ntenant B's waits for a start: {', '.join(f'{w * 1000:.0f}' for w in waits)} ms")
    assert max(waits) < 0.1
    assert flooding, "the flood ended before the trickle did: nothing was measured"
    in_order = [n for n, _ in sorted(basic.STARTS["flood"], key=lambda s: s[1])]
    assert in_order[:4] == [0, 1, 2, 3], (
        f"the flood's second chunk ran beside its first ({in_order}): the spare worker "
        "took the work of a tenant with a chunk running")


def test_a_flooding_tenant_does_not_starve_a_trickle() -> None:
    """Tenant A floods 20,000 items, tenant B sends 500, equal weights, same tier: while
    B's items run, A starts about as many as B (counted, not timed: a count does not move
    with the machine's load)."""
    bindings = [Binding("flood", Source("kafka", "t"), "tests.funcs.basic:timed", tenant="a"),
                Binding("trickle", Source("kafka", "t"), "tests.funcs.basic:timed", tenant="b")]
    ms = 2.0

    async def b_with_flood() -> float:
        basic.reset()
        scheduler = local_scheduler(bindings, options=SchedulerOptions(workers=8))
        scheduler.start()
        await scheduler.process(timed_items("trickle", 100, ms))  # learn the chunk size
        flood = [asyncio.create_task(scheduler.process(
            timed_items("flood", 1000, ms, start=k * 1000))) for k in range(20)]
        await until(lambda: len(basic.STARTS.get("flood", [])) >= 100 and
                    scheduler.queue.items > 5000, message="the flood runs and is queued")
        elapsed = await _timed(scheduler, _trickle(scheduler, ms))
        results = await asyncio.gather(*flood)
        assert sum(len(r) for r in results) == 20_000
        await scheduler.stop()
        return elapsed

    shared = asyncio.run(b_with_flood())
    trickle = sorted(s for n, s in basic.STARTS["trickle"] if n >= 100_000)
    flood = sorted(s for _, s in basic.STARTS["flood"])
    meanwhile = sum(1 for s in flood if trickle[0] <= s <= trickle[-1])
    print(f"\ntenant B's 500 items ({ms:g} ms each, 8 workers) took {shared * 1000:.0f} ms "
          f"beside A's 20,000-item flood; A started {meanwhile} meanwhile")
    # Shared fairly, A starts about 500 while B's 500 run; starved, B would start only
    # after most of A's 20,000.
    assert meanwhile <= 4 * 500, "tenant B waited for tenant A's flood"
    assert trickle[-1] < flood[len(flood) // 2], "B's last item started after half the flood"


async def _trickle(scheduler: Scheduler, ms: float) -> list[Outcome]:
    parts = [scheduler.process(timed_items("trickle", 100, ms, start=100_000 + k * 100))
             for k in range(5)]
    return [o for part in await asyncio.gather(*parts) for o in part]


async def _timed(scheduler: Scheduler, work: object) -> float:
    start = time.monotonic()
    outcomes = await work  # type: ignore[misc]
    assert len(outcomes) == 500 and all(o["status"] == "ok" for o in outcomes)
    return time.monotonic() - start


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

"""The chunk runners (issue 30): an async chunk under one timer, its lanes started on demand;
a sync chunk of a function that waits spread over several threads. The timeout semantics
(issue 26 point 4) end to end: tests/scheduler/test_scheduler_outcomes.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler import FunctionResolver
from asynctier.scheduler import runtime as runtime_module
from asynctier.scheduler.runtime import AsyncRun, Runtime
from asynctier.scheduler.sizing import ChunkSizer
from tests.funcs import basic
from tests.scheduler_harness import ALLOW, item


def _items(binding: str, sleeps: list[float], **extra: float) -> list[Item]:
    return [item(binding, n, json.dumps({"sleep": s, "ms": s * 1000, **extra}).encode())
            for n, s in enumerate(sleeps)]


def _run(runtime: Runtime, binding: Binding, batch: list[Item]) -> dict[int, Outcome]:
    async def go() -> list[Outcome]:
        return await runtime.run(runtime.job(binding), batch)

    outcomes = asyncio.run(go())
    assert sorted(o["id"] for o in outcomes) == [i["id"] for i in batch]
    return {o["id"]: o for o in outcomes}


def _cancelled(binding: str) -> float:
    return REGISTRY.get_sample_value("asynctier_function_timeouts_total",
                                     {"binding": binding, "outcome": "cancelled"}) or 0.0


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    rt = Runtime(FunctionResolver(ALLOW), 2)
    yield rt
    rt.close()


def test_only_the_async_items_past_their_timeout_fail_and_the_rest_run_on(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lanes for six items: the items started later (after a slow one timed out) get a
    deadline of their own, and the one timer of the chunk is set again for them."""
    monkeypatch.setattr(runtime_module, "ASYNC_LANES", 2)
    binding = Binding("alanes", Source("kafka", "t"), "tests.funcs.basic:async_sleepy",
                      execution=Execution(timeout_s=0.3))
    before = _cancelled("alanes")
    started = time.monotonic()
    outcomes = _run(runtime, binding, _items("alanes", [5, 0.0, 0.2, 5, 0.2, 0.0]))
    took = time.monotonic() - started
    late = {n for n, o in outcomes.items() if o["status"] != "ok"}
    assert late == {0, 3}, outcomes
    for n in late:
        assert outcomes[n]["reason"] == "timeout"
        assert outcomes[n]["error"] == "timed out after 0.3s"
    assert _cancelled("alanes") - before == 2
    assert took < 2.0  # neither 5 s sleep was waited for


def test_an_async_function_that_ignores_the_cancel_still_fails_with_timeout(
        runtime: Runtime) -> None:
    binding = Binding("astub", Source("kafka", "t"), "tests.funcs.basic:async_stubborn",
                      execution=Execution(timeout_s=0.2))
    outcomes = _run(runtime, binding, _items("astub", [5, 0.0], after=0.1))
    assert outcomes[0]["reason"] == "timeout" and outcomes[1]["status"] == "ok"


def test_a_cancelled_async_chunk_leaves_no_lane_running(runtime: Runtime) -> None:
    """The chunk's caller goes away: the cancel reaches every item, none is answered."""
    binding = Binding("agauged", Source("kafka", "t"), "tests.funcs.basic:async_gauged",
                      execution=Execution(timeout_s=30))
    basic.reset()

    async def go() -> None:
        task = asyncio.ensure_future(runtime.run(runtime.job(binding),
                                                 _items("agauged", [10.0] * 20)))
        while basic.ACTIVE["now"] < 20:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert basic.ACTIVE["now"] == 0

    asyncio.run(asyncio.wait_for(go(), 5))


def test_async_items_that_wait_run_at_once_and_no_ops_need_no_lane_each(
        runtime: Runtime) -> None:
    binding = Binding("agauged", Source("kafka", "t"), "tests.funcs.basic:async_gauged",
                      execution=Execution(timeout_s=30))
    basic.reset()
    _run(runtime, binding, _items("agauged", [0.05] * 100))
    assert basic.ACTIVE["peak"] == 100

    async def lanes_of_noops() -> int:
        noop = Binding("anoop", Source("kafka", "t"), "tests.funcs.basic:async_noop")
        run = AsyncRun(runtime.job(noop), _items("anoop", [0.0] * 100))
        assert len(await run.run()) == 100
        return len(run.tasks)

    assert asyncio.run(lanes_of_noops()) <= 2


def test_a_sync_chunk_that_waits_spreads_over_threads_and_a_fast_one_does_not(
        runtime: Runtime) -> None:
    waits = Binding("gauged", Source("kafka", "t"), "tests.funcs.basic:gauged")
    basic.reset()
    _run(runtime, waits, _items("gauged", [0.005] * 8))  # measured: 5 ms per item
    assert runtime.parts("gauged", 40) == runtime.spread
    _run(runtime, waits, _items("gauged", [0.005] * 40))
    assert 2 <= basic.ACTIVE["peak"] <= runtime.spread, basic.ACTIVE
    fast = Binding("noop", Source("kafka", "t"), "tests.funcs.basic:noop")
    for _ in range(3):
        _run(runtime, fast, _items("noop", [0.0] * 200))
    assert runtime.parts("noop", 64) == 1, runtime._per_item_s


def test_a_sync_chunk_is_sized_by_its_threads_time_not_its_wait_for_a_thread() -> None:
    rt = Runtime(FunctionResolver(ALLOW), 1, spread=1)  # one thread: the second chunk waits
    waits = Binding("gauged", Source("kafka", "t"), "tests.funcs.basic:gauged")
    job = rt.job(waits)

    async def timed(batch: list[Item]) -> float:
        started = time.monotonic()
        await rt.run(job, batch)
        return time.monotonic() - started

    async def two_at_once() -> list[float]:
        return list(await asyncio.gather(timed(_items("gauged", [0.005] * 4)),
                                         timed(_items("gauged", [0.005] * 4))))

    try:
        walls = asyncio.run(two_at_once())
        worked = rt.work_s(job, 4, max(walls))
        assert max(walls) >= 0.04  # the second chunk waited for the first one's thread
        assert 0.018 <= worked <= 0.03, (worked, walls, rt._per_item_s)
        assert rt.work_s(job, 4, 1.0) == worked  # the wall time does not enter it
    finally:
        rt.close()


def test_a_spread_sync_chunk_holds_its_worker_for_its_items_per_thread(
        runtime: Runtime) -> None:
    waits = Binding("gauged", Source("kafka", "t"), "tests.funcs.basic:gauged")
    _run(runtime, waits, _items("gauged", [0.005] * 8))  # measured: about 5 ms per item
    per_item = runtime._per_item_s["gauged"]
    assert runtime.spread == 8
    assert runtime.work_s(runtime.job(waits), 40, 9.0) == pytest.approx(per_item * 5)
    anoop = Binding("anoop", Source("kafka", "t"), "tests.funcs.basic:async_noop")
    assert runtime.work_s(runtime.job(anoop), 40, 9.0) == 9.0  # async: its wall time


def test_a_spread_chunk_gives_up_on_the_overdue_item_alone(runtime: Runtime) -> None:
    """One wake-up per chunk: the loop still gives up on an item past its timeout (its
    thread keeps running), answers it ``timeout`` and runs the rest of its part in a new
    part, while the other parts finish."""
    binding = Binding("spreadslow", Source("kafka", "t"), "tests.funcs.basic:sleepy",
                      execution=Execution(timeout_s=0.3))
    job = runtime.job(binding)
    _run(runtime, binding, _items("spreadslow", [0.005] * 8))  # measured: it spreads
    assert runtime.parts("spreadslow", 16) > 1
    sleeps = [0.005] * 16
    sleeps[1] = 1.0
    batch = _items("spreadslow", sleeps)

    async def go() -> tuple[list[Outcome], float, int]:
        started = time.monotonic()
        results, late = await runtime.run_held(job, batch)
        took = time.monotonic() - started
        assert runtime.hung_threads == 1
        await asyncio.gather(*late)  # the overrunning call returns, its thread is free
        return results, took, len(late)

    results, took, late = asyncio.run(go())
    assert took < 0.8, took  # the chunk did not wait for the overrunning call
    assert late == 1 and runtime.hung_threads == 0
    by_id = {o["id"]: o for o in results}
    assert sorted(by_id) == [i["id"] for i in batch]
    assert by_id[batch[1]["id"]]["reason"] == "timeout"
    assert all(by_id[i["id"]]["status"] == "ok" for n, i in enumerate(batch) if n != 1)


def test_a_binding_whose_chunks_spread_is_sized_for_the_spread_target() -> None:
    sizer = ChunkSizer(target_s=0.02, min_items=8, max_items=256)
    sizer.observe("waits", 0.04, 20)  # 2 ms per item, one thread
    assert sizer.size("waits") == 10
    sizer.observe("waits", 0.04, 20, spread=True)  # by one thread's clock, spread
    assert sizer.spread_target_s == 0.04
    assert sizer.size("waits") == 20
    sizer.observe("waits", 0.04, 20)  # not spread any more
    assert sizer.size("waits") == 10


def test_a_measured_async_binding_gets_the_largest_chunks() -> None:
    sizer = ChunkSizer(target_s=0.02, min_items=8, max_items=256)
    sizer.observe("slow-sync", 1.0, 4)
    sizer.observe("slow-async", 1.0, 4, concurrent=True)
    assert sizer.size("slow-sync") == 1
    assert sizer.size("slow-async") == 256

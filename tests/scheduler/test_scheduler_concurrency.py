"""Many calls at once, over gRPC and in the core: every item is answered exactly once, and
no more than ``workers`` chunks run at a time: ``workers * SYNC_SPREAD`` sync items (a
chunk of a function that waits spreads over up to ``SYNC_SPREAD`` threads), ``workers *
ASYNC_LANES`` async ones. How fast: ``python -m bench.scheduler_rate``.
"""

from __future__ import annotations

import asyncio
import json

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.wire import Outcome
from asynctier.scheduler import SchedulerOptions
from asynctier.scheduler.runtime import ASYNC_LANES, SYNC_SPREAD
from tests.funcs import basic
from tests.scheduler_harness import items, local_scheduler, running_scheduler

CALLS = 8
BATCH = 250
WORKERS = 4
GAUGED = Binding("gauged", Source("kafka", "t"), "tests.funcs.basic:gauged")
ASYNC_GAUGED = Binding("agauged", Source("kafka", "t"), "tests.funcs.basic:async_gauged")
PAYLOAD = json.dumps({"ms": 0.5}).encode()


def _answered_once(calls: list[list[Outcome]]) -> None:
    """Each call got one ``ok`` per item it sent, and nothing else."""
    for k, outcomes in enumerate(calls):
        assert sorted(o["id"] for o in outcomes) == list(range(k * BATCH, (k + 1) * BATCH))
        assert {o["status"] for o in outcomes} == {"ok"}


def test_concurrent_calls_over_grpc_are_each_answered_once_within_the_workers(
        settings: Settings) -> None:
    basic.reset()
    options = SchedulerOptions(workers=WORKERS)
    with running_scheduler(settings, [GAUGED], options=options) as running:
        pending = [running.client.submit(items("gauged", BATCH, start=k * BATCH, payload=PAYLOAD))
                   for k in range(CALLS)]
        calls = [call.result() for call in pending]
    _answered_once(calls)
    assert basic.ACTIVE["calls"] == CALLS * BATCH  # each item ran once
    assert 2 <= basic.ACTIVE["peak"] <= WORKERS * SYNC_SPREAD, basic.ACTIVE


def test_concurrent_calls_in_the_core_are_each_answered_once_within_the_workers() -> None:
    async def scenario(binding: Binding) -> list[list[Outcome]]:
        scheduler = local_scheduler([binding], options=SchedulerOptions(workers=WORKERS))
        scheduler.start()
        try:
            return list(await asyncio.gather(*(
                scheduler.process(items(binding.name, BATCH, start=k * BATCH, payload=PAYLOAD))
                for k in range(CALLS))))
        finally:
            await scheduler.stop()

    for binding, most in ((GAUGED, WORKERS * SYNC_SPREAD), (ASYNC_GAUGED, WORKERS * ASYNC_LANES)):
        basic.reset()
        _answered_once(asyncio.run(scenario(binding)))
        assert basic.ACTIVE["calls"] == CALLS * BATCH, binding.function
        assert 2 <= basic.ACTIVE["peak"] <= most, (binding.function, basic.ACTIVE)

"""The scheduler's background loops are supervised: each one made to fail once is counted
(``asynctier_task_restarts_total{task,reason}``) and runs again after its backoff. Before,
the run-once writer and heartbeat, the leases' heartbeat, the harvester, the saturation
look and the workers were bare tasks: one exception ended them without a word."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from asynctier.platform.config import Settings
from asynctier.platform.supervise import RestartPolicy, supervise_task
from asynctier.platform.wire import ok
from asynctier.scheduler import dispatch
from asynctier.scheduler.admission import OpenAdmission
from asynctier.scheduler.bounded import BoundedQueue
from asynctier.scheduler.dispatch import Dispatcher
from asynctier.scheduler.gates import deferral as deferral_gate
from asynctier.scheduler.gates.deferral import DeferralGate
from asynctier.scheduler.limits.concurrency import LeasePool
from asynctier.scheduler.limits.once import RunOnce
from asynctier.scheduler.queues import FairQueue
from asynctier.scheduler.resolver import FunctionResolver
from asynctier.scheduler.runtime import Runtime
from asynctier.scheduler.sizing import ChunkSizer
from tests.scheduler.test_limits_bad_values import BINDING
from tests.scheduler.test_limits_redis import make_items

#: Restarts at once in these tests (the default backoff starts at a second).
FAST = RestartPolicy(first_s=0.01, max_s=0.05)
#: How long a loop has to fail, be counted and run again.
WITHIN_S = 5.0


def restarts(task: str) -> float:
    """``asynctier_task_restarts_total`` of ``task`` for a RuntimeError."""
    return REGISTRY.get_sample_value("asynctier_task_restarts_total",
                                     {"task": task, "reason": "RuntimeError"}) or 0.0


def fail_once(real: Callable[..., Awaitable[Any]], calls: list[int]) -> Callable[..., Any]:
    """``real``, but its first call raises RuntimeError; ``calls`` counts every call."""
    async def patched(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected: fails once")
        return await real(*args, **kwargs)
    return patched


async def until(predicate: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(WITHIN_S):
        while not predicate():
            await asyncio.sleep(0.01)


def test_the_lease_heartbeat_is_restarted(settings: Settings, redis_client: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    task, before = "asynctier-lease-heartbeat", restarts("asynctier-lease-heartbeat")

    async def scenario() -> None:
        client = Redis.from_url(settings.redis_url)
        pool = LeasePool(client, settings.names, lease_s=0.15, policy=FAST)
        calls: list[int] = []
        monkeypatch.setattr(pool, "_renew_binding", fail_once(pool._renew_binding, calls))
        try:
            await pool.acquire(BINDING.with_changes(limits=replace(BINDING.limits,
                                                                   max_concurrency=2)))
            await until(lambda: len(calls) >= 3, "renewals after the failure")
            assert restarts(task) == before + 1
        finally:
            await pool.close()
            await client.aclose()

    asyncio.run(scenario())


def test_the_run_once_heartbeat_and_writer_are_restarted(
        settings: Settings, redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    beat, writer = "asynctier-once-heartbeat", "asynctier-once-writer"
    beats_before, writes_before = restarts(beat), restarts(writer)

    async def scenario() -> None:
        client = Redis.from_url(settings.redis_url)
        once = RunOnce(client, settings.names, holder_ttl_s=0.15, policy=FAST)
        beats: list[int] = []
        writes: list[int] = []
        monkeypatch.setattr(once, "_beat", fail_once(once._beat, beats))
        monkeypatch.setattr(once, "_write", fail_once(once._write, writes))
        items = make_items(["t/0/1", "t/0/2"])
        try:
            assert await once.claim("b", items) == "00"
            await until(lambda: len(beats) >= 3, "beats after the failure")
            assert restarts(beat) == beats_before + 1
            async with asyncio.timeout(WITHIN_S):  # written by the writer run again
                assert await once.finish("b", items, [ok(0), ok(1)]) == set()
            assert restarts(writer) == writes_before + 1
            assert await once.claim("b", items) == "11"  # done: the write landed
        finally:
            await once.close()
            await client.aclose()

    asyncio.run(scenario())


class _Harvest:
    def __init__(self) -> None:
        self.takes = 0

    def take(self) -> None:
        self.takes += 1
        if self.takes == 1:
            raise RuntimeError("injected: fails once")


def test_the_harvester_is_restarted() -> None:
    task, before = "asynctier-harvester", restarts("asynctier-harvester")

    async def scenario() -> None:
        runtime = Runtime(FunctionResolver(["tests"]), threads=1)
        runtime.restart_policy = FAST
        harvest = _Harvest()
        try:
            runtime._harvests.add(harvest)  # type: ignore[arg-type]
            runtime._ensure_harvester()
            await until(lambda: harvest.takes >= 3, "takes after the failure")
            assert restarts(task) == before + 1
        finally:
            runtime.close()

    asyncio.run(scenario())


def test_the_saturation_look_is_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    task, before = "scheduler-saturation", restarts("scheduler-saturation")
    monkeypatch.setattr(deferral_gate, "WATCH_EVERY_S", 0.01)
    monkeypatch.setattr(deferral_gate, "supervise_task", partial(supervise_task, policy=FAST))

    async def scenario() -> None:
        gate = DeferralGate(BoundedQueue(FairQueue(), 100), lambda chunk, outcomes: None)
        calls = []
        real = gate.saturation.saturated

        def saturated() -> bool:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("injected: fails once")
            return real()
        monkeypatch.setattr(gate.saturation, "saturated", saturated)
        gate.start()
        try:
            await until(lambda: len(calls) >= 3, "looks after the failure")
            assert restarts(task) == before + 1
        finally:
            await gate.close()

    asyncio.run(scenario())


def test_a_worker_is_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    task, before = "scheduler-worker-0", restarts("scheduler-worker-0")
    monkeypatch.setattr(dispatch, "supervise_task", partial(supervise_task, policy=FAST))

    async def scenario() -> None:
        runtime = Runtime(FunctionResolver(["tests"]), threads=1)
        queue = BoundedQueue(FairQueue(), 100)
        dispatcher = Dispatcher(runtime, OpenAdmission(), queue, ChunkSizer())
        dispatcher.workers = 1
        calls: list[int] = []
        monkeypatch.setattr(queue, "get", fail_once(queue.get, calls))
        dispatcher.start()
        try:
            await until(lambda: len(calls) >= 2, "the worker waiting again")
            assert restarts(task) == before + 1
        finally:
            await dispatcher.stop()
            runtime.close()

    asyncio.run(scenario())

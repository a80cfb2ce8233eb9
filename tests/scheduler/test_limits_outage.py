"""Redis going away under RedisAdmission: fail open, fail closed, and coming back.

These tests start their own redis-server on a free port (never the shared one), stop it in
the middle of a run and start it again on the same port with the same data.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from asynctier import dev as devstack
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Limits, Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.wire import Item
from asynctier.scheduler.limits import AdmissionConfig, Quota, RedisAdmission
from tests.helpers import MinuteClock

BASE = Binding(name="orders", source=Source("kafka", "orders"), function="app.jobs:handle",
               tenant="acme", limits=Limits(rate_per_s=50.0, burst=5, max_concurrency=2))
FAST = AdmissionConfig(probe_interval_s=0.2, socket_timeout_s=0.5)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[devstack.RedisNode]:
    """A redis-server of this test alone."""
    try:
        node = devstack.start_test_redis(tmp_path)
    except ServiceError as exc:
        pytest.fail(f"could not start redis-server: {exc}")
    try:
        yield node
    finally:
        pid = node.daemon.pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        node.stop()


def items(tag: str, n: int) -> list[Item]:
    return [{"id": i, "binding": BASE.name, "payload": b"{}", "key": None, "headers": [],
             "attempt": 1, "source_ref": f"{tag}/{i}", "record_time_ms": 0,
             "priority": 0, "deadline_ms": None}
            for i in range(n)]


async def peak_inside(admission: RedisAdmission, binding: Binding, tasks: int) -> int:
    """Run ``tasks`` short holders of a slot at once; the most inside together."""
    inside, peak = [0], [0]

    async def run() -> None:
        async with admission.slot(binding):
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            await asyncio.sleep(0.01)
            inside[0] -= 1

    await asyncio.gather(*(run() for _ in range(tasks)))
    return peak[0]


async def timed_take(admission: RedisAdmission, binding: Binding, n: int) -> float:
    start = time.monotonic()
    await admission.take_tokens(binding, n)
    return time.monotonic() - start


def test_fail_open_admits_through_the_local_limiter_and_limits_return(
        own_redis: devstack.RedisNode, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix)

    async def scenario() -> None:
        admission = RedisAdmission(settings, FAST)
        try:
            await admission.quotas.set("acme", Quota(per_minute=10))
            assert len(await admission.over_quota(BASE, items("up", 15))) == 5
            await asyncio.to_thread(own_redis.stop)

            # Down: the local limiter takes over, quotas are not enforced, nothing fails.
            assert await admission.over_quota(BASE, items("down", 15)) == {}
            await admission.take_tokens(BASE, 5)  # empty the local bucket (burst 5)
            assert 0.4 <= await timed_take(admission, BASE, 25) <= 0.8  # 25 at 50/s locally
            assert await peak_inside(admission, BASE, 10) == 2  # the local cap
            assert admission.redis_down
            fallbacks = admission.stats.redis_fallbacks[BASE.name]
            assert fallbacks >= 3

            # Back: the shared limits apply again by themselves.
            await asyncio.to_thread(own_redis.start)
            deadline = time.monotonic() + 10
            while not await admission.over_quota(BASE, items("back", 15)):
                assert time.monotonic() < deadline, "the quota never applied again"
                await asyncio.sleep(0.1)
            assert not admission.redis_down
            settled = admission.stats.redis_fallbacks[BASE.name]
            await admission.take_tokens(BASE, 1)
            assert await peak_inside(admission, BASE, 10) == 2
            assert admission.stats.redis_fallbacks[BASE.name] == settled
        finally:
            await admission.close()

    with caplog.at_level(logging.WARNING, logger="asynctier.scheduler.limits"):
        asyncio.run(scenario())
    loud = [r for r in caplog.records if "REDIS UNREACHABLE" in r.getMessage()]
    assert len(loud) == 1, [r.getMessage() for r in loud]  # once per outage, not per item
    assert "binding orders fails open" in loud[0].getMessage()
    assert any("Redis answers again" in r.getMessage() for r in caplog.records)


def test_fail_closed_pauses_admission_until_redis_returns(own_redis: devstack.RedisNode,
                                                          prefix: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix)
    binding = BASE.with_changes(limits=replace(BASE.limits, redis_policy="fail_closed"))

    async def scenario() -> None:
        admission = RedisAdmission(settings, FAST, clock=MinuteClock(1_000))  # one minute
        try:
            await admission.quotas.set("acme", Quota(per_minute=1000))
            await admission.take_tokens(binding, 5)
            await asyncio.to_thread(own_redis.stop)

            take = asyncio.create_task(admission.take_tokens(binding, 1))
            quota = asyncio.create_task(admission.over_quota(binding, items("closed", 3)))
            slot = asyncio.create_task(peak_inside(admission, binding, 3))
            done, _ = await asyncio.wait([take, quota, slot], timeout=1.5)
            assert not done, "admission went on without Redis under fail_closed"
            assert not admission.stats.redis_fallbacks

            await asyncio.to_thread(own_redis.start)
            await asyncio.wait_for(asyncio.gather(take, quota, slot), 10)
            assert quota.result() == {}
            assert slot.result() == 2
            assert not admission.redis_down
            assert (await admission.quotas.usage("acme")).minute == 3  # charged once back
        finally:
            await admission.close()

    asyncio.run(scenario())


def test_a_hung_redis_costs_at_most_the_socket_timeout_under_fail_open(
        own_redis: devstack.RedisNode, prefix: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix)
    pid = own_redis.daemon.pid()
    assert pid is not None

    async def scenario() -> None:
        admission = RedisAdmission(settings, FAST)
        try:
            await admission.take_tokens(BASE, 1)
            os.kill(pid, signal.SIGSTOP)  # answers nothing: every call times out
            first = await timed_take(admission, BASE, 1)
            assert first <= 2 * FAST.socket_timeout_s + 0.5
            later = [await timed_take(admission, BASE, 1) for _ in range(3)]
            assert max(later) < 0.1  # no new timeout until the next probe
            assert admission.redis_down
            os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            while admission.redis_down:
                assert time.monotonic() < deadline, "never saw Redis back"
                await admission.take_tokens(BASE, 1)
                await asyncio.sleep(0.05)
        finally:
            os.kill(pid, signal.SIGCONT)
            await admission.close()

    asyncio.run(scenario())

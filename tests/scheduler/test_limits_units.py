"""Pure pieces of the limits package: AIMD (with properties), the in-memory token bucket,
the resizable local limit and the outage tracker. No Redis here."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.scheduler.limits.aimd import Aimd, AimdConfig
from asynctier.scheduler.limits.bucket import TokenBucket, burst_of
from asynctier.scheduler.limits.concurrency import LocalLimit
from asynctier.scheduler.limits.outage import Outage

configs = st.builds(
    AimdConfig,
    floor=st.integers(1, 4),
    decrease=st.floats(0.1, 0.9),
    increase=st.floats(0.5, 4.0),
    failure_ratio=st.floats(0.05, 1.0),
    window=st.integers(1, 64),
)
reports = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=60)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- AIMD ---------------------------------------------------------------------------------


@given(config=configs, ceiling=st.integers(1, 300), history=reports)
def test_aimd_limit_stays_within_floor_and_ceiling(config: AimdConfig, ceiling: int,
                                                   history: list[tuple[int, int]]) -> None:
    aimd = Aimd(ceiling, config)
    for ok, failed in history:
        current = aimd.record(ok, failed)
        assert config.floor <= current <= max(ceiling, config.floor)
        assert config.floor <= aimd.limit <= max(ceiling, config.floor)


@given(config=configs, ceiling=st.integers(2, 300), history=reports)
def test_aimd_a_window_of_failures_shrinks_multiplicatively(
        config: AimdConfig, ceiling: int, history: list[tuple[int, int]]) -> None:
    aimd = Aimd(ceiling, config)
    for ok, failed in history:
        aimd.record(ok, failed)
    aimd.record(0, 0)
    aimd._ok = aimd._failed = 0  # start a fresh window
    before = aimd.limit
    aimd.record(0, config.window)
    assert aimd.limit == max(config.floor, before * config.decrease)
    if before > config.floor:
        assert aimd.limit < before


@given(config=configs, ceiling=st.integers(1, 300), history=reports)
def test_aimd_a_window_of_successes_grows_additively(
        config: AimdConfig, ceiling: int, history: list[tuple[int, int]]) -> None:
    aimd = Aimd(ceiling, config)
    for ok, failed in history:
        aimd.record(ok, failed)
    aimd._ok = aimd._failed = 0
    before = aimd.limit
    aimd.record(config.window, 0)
    assert aimd.limit == min(float(aimd.ceiling), before + config.increase)
    if before < aimd.ceiling:
        assert aimd.limit > before


@given(config=configs, ceiling=st.integers(1, 64))
def test_aimd_recovers_to_the_ceiling_after_a_spike(config: AimdConfig, ceiling: int) -> None:
    aimd = Aimd(ceiling, config)
    for _ in range(200):  # 64 * 0.9 ** 200 < 1
        aimd.record(0, config.window)
    assert aimd.current == config.floor
    windows = 0
    while not aimd.at_ceiling:
        aimd.record(config.window, 0)
        windows += 1
        assert windows <= ceiling / config.increase + 1
    assert aimd.current == max(ceiling, config.floor)


def test_aimd_decides_once_per_window_not_per_failure() -> None:
    aimd = Aimd(32, AimdConfig(window=16, decrease=0.5))
    aimd.record(0, 256)  # one chunk of 256 failures: one decision
    assert aimd.current == 16
    aimd.record(0, 10)  # window not full yet
    assert aimd.current == 16


def test_aimd_resize_keeps_the_limit_below_the_new_ceiling() -> None:
    aimd = Aimd(10)
    aimd.resize(4)
    assert aimd.current == 4 and aimd.at_ceiling
    aimd.resize(8)
    assert aimd.current == 4 and not aimd.at_ceiling


def test_aimd_config_is_checked() -> None:
    with pytest.raises(ValueError):
        AimdConfig(decrease=1.0)
    with pytest.raises(ValueError):
        AimdConfig(floor=0)


# -- token bucket -------------------------------------------------------------------------


def test_bucket_gives_the_burst_at_once_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate_per_s=100, burst=10, clock=clock)
    assert bucket.reserve(10) == 0
    assert bucket.reserve(5) == pytest.approx(0.05)
    assert bucket.reserve(5) == pytest.approx(0.10)  # queued behind the first
    clock.now += 0.10
    assert bucket.reserve(1) == pytest.approx(0.01)


def test_bucket_takes_more_than_the_burst_in_one_step() -> None:
    bucket = TokenBucket(rate_per_s=200, burst=200, clock=Clock())
    assert bucket.reserve(256) == pytest.approx(56 / 200)


@given(rate=st.floats(1, 10_000), burst=st.integers(1, 1000),
       takes=st.lists(st.tuples(st.integers(1, 500), st.floats(0, 2)), min_size=1,
                      max_size=50))
def test_bucket_never_admits_more_than_burst_plus_rate_times_time(
        rate: float, burst: int, takes: list[tuple[int, float]]) -> None:
    clock = Clock()
    start = clock.now
    bucket = TokenBucket(rate, burst, clock=clock)
    taken = 0
    for n, gap in takes:
        clock.now += gap
        wait = bucket.reserve(n)
        taken += n
        started_at = clock.now + wait
        assert taken <= burst + (started_at - start) * rate + 1e-6 * taken


def test_burst_defaults_to_one_second_of_rate() -> None:
    base = Binding(name="b", source=Source("kafka", "t"), function="m:f")
    assert burst_of(base.with_changes(limits=replace(base.limits, rate_per_s=200.0))) == 200
    assert burst_of(base.with_changes(limits=replace(base.limits, rate_per_s=0.5))) == 1
    assert burst_of(base.with_changes(limits=replace(base.limits, rate_per_s=200.0,
                                                     burst=20))) == 20


# -- local limit --------------------------------------------------------------------------


def test_local_limit_caps_and_serves_in_order() -> None:
    async def scenario() -> None:
        limit = LocalLimit(2)
        assert await limit.acquire() is False
        assert await limit.acquire() is False
        order: list[int] = []

        async def wait(i: int) -> None:
            await limit.acquire()
            order.append(i)

        tasks = [asyncio.create_task(wait(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert order == [] and limit.held == 2
        limit.release()
        limit.release()
        await asyncio.sleep(0)
        assert order == [0, 1] and limit.held == 2
        limit.resize(3)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2] and limit.held == 3

    asyncio.run(scenario())


def test_local_limit_shrinks_while_held_and_survives_cancellation() -> None:
    async def scenario() -> None:
        limit = LocalLimit(3)
        for _ in range(3):
            await limit.acquire()
        limit.resize(1)
        waiter = asyncio.create_task(limit.acquire())
        limit.release()
        limit.release()
        await asyncio.sleep(0)
        assert not waiter.done()  # 1 held, size 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        limit.release()
        assert limit.held == 0
        assert await limit.acquire() is False

    asyncio.run(scenario())


def test_local_limit_none_is_no_limit() -> None:
    async def scenario() -> None:
        limit = LocalLimit(None)
        for _ in range(1000):
            assert await limit.acquire() is False
        assert limit.held == 1000

    asyncio.run(scenario())


# -- outage -------------------------------------------------------------------------------


def test_outage_logs_once_per_binding_per_outage_and_probes_at_intervals(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    outage = Outage(probe_interval_s=1.0, clock=clock)
    a = Binding(name="a", source=Source("kafka", "t"), function="m:f")
    b = a.with_changes(name="b", limits=replace(a.limits, redis_policy="fail_closed"))
    with caplog.at_level(logging.WARNING, logger="asynctier.scheduler.limits.outage"):
        for _ in range(100):
            outage.failed(a, ConnectionError("refused"))
        outage.failed(b, ConnectionError("refused"))
        assert outage.down and not outage.may_try()
        clock.now += 1.0
        assert outage.may_try()
        outage.recovered()
        outage.recovered()
        outage.failed(a, ConnectionError("refused"))
    lines = [r.getMessage() for r in caplog.records]
    assert sum("binding a fails open" in line for line in lines) == 2  # two outages
    assert sum("binding b is fail_closed" in line for line in lines) == 1
    assert sum(line.startswith("Redis answers again") for line in lines) == 1

"""The circuit breaker on a real Redis: opens, parks without spending attempts, probes at a
capped rate, ramps, closes; two schedulers (two Breakers) share one state."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Breaker, Source
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item, Outcome, ok, retry
from asynctier.scheduler.limits.breaker import (
    CLOSED,
    OPEN,
    RAMP,
    BreakerConfig,
    Breakers,
    parse_breaker,
)

FAST = BreakerConfig(probe_interval_s=0.3, park_s=2.0, ramp_s=0.6, min_calls=4)
BINDING = Binding("pay", Source("kafka", "t"), "m:f", breaker=Breaker(ratio=0.5, window_s=10.0))


def _items(n: int) -> list[Item]:
    return [{"id": i, "binding": "pay", "payload": b"{}", "key": None, "headers": [],
             "attempt": 1, "source_ref": "", "record_time_ms": 0, "priority": 0,
             "deadline_ms": None} for i in range(n)]


def _fail(items: list[Item]) -> list[Outcome]:
    return [retry(i["id"], "downstream down") for i in items]


def test_parse_breaker() -> None:
    assert parse_breaker("50%/30s") == (0.5, 30.0)
    assert parse_breaker("12.5% / 1m") == (0.125, 60.0)
    with pytest.raises(ValueError, match="SHARE%/WINDOW"):
        parse_breaker("half")


def test_a_binding_without_a_breaker_is_never_held(settings: Settings,
                                                   redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        b = Breakers.from_settings(settings, FAST)
        plain = Binding("plain", Source("kafka", "t"), "m:f")
        items = _items(5)
        assert await b.admit(plain, items) == ([], items)
        await b.close()
    asyncio.run(scenario())


def test_open_park_probe_ramp_close_shared_by_two_schedulers(
        settings: Settings, redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        one = Breakers.from_settings(settings, FAST)
        two = Breakers.from_settings(settings, FAST)  # a second scheduler
        try:
            items = _items(4)
            _, let = await one.admit(BINDING, items)
            assert len(let) == 4 and one.state("pay") == CLOSED
            await one.report(BINDING, let, _fail(let))  # 4 of 4 failed: opens
            assert one.state("pay") == OPEN
            parked, let = await two.admit(BINDING, _items(10))  # shared: open there too
            assert two.state("pay") == OPEN and len(parked) + len(let) == 10
            assert all(o["status"] == "retry" and not o["spends_attempt"]
                       and o["after_s"] == FAST.park_s for o in parked)
            # probes: at most one per probe interval across both schedulers
            probes = 0
            began = time.monotonic()
            while time.monotonic() - began < 1.0:
                for b in (one, two):
                    _, let = await b.admit(BINDING, _items(10))
                    probes += len(let)
                    if let:  # a failing probe spends no attempt
                        back = await b.report(BINDING, let, _fail(let))
                        assert not back[0]["spends_attempt"]
                await asyncio.sleep(0.02)
            assert 2 <= probes <= 1.0 / FAST.probe_interval_s + 2, probes
            assert one.state("pay") == OPEN
            let = []
            while not let:  # the next probe succeeds: the breaker ramps
                _, let = await one.admit(BINDING, _items(10))
                await asyncio.sleep(0.02)
            await one.report(BINDING, let, [ok(i["id"]) for i in let])
            assert one.state("pay") == RAMP
            _, early = await two.admit(BINDING, _items(100))
            assert 1 <= len(early) < 100  # ramped: a share, not all at once
            await asyncio.sleep(FAST.ramp_s)
            _, late = await two.admit(BINDING, _items(100))
            assert len(late) == 100 and two.state("pay") == CLOSED
        finally:
            await one.close()
            await two.close()
    asyncio.run(scenario())


def test_bad_input_does_not_open_the_breaker(settings: Settings,
                                             redis_client: redis.Redis) -> None:
    async def scenario() -> None:
        b = Breakers.from_settings(settings, FAST)
        items = _items(10)
        undecodable = [retry(i["id"], "bad json", reason="undecodable") for i in items]
        undecodable = [{**o, "status": "failed"} for o in undecodable]  # type: ignore[misc]
        await b.report(BINDING, items, undecodable)
        _, let = await b.admit(BINDING, items)
        assert len(let) == 10 and b.state("pay") == CLOSED
        await b.close()
    asyncio.run(scenario())

"""Values that are no such values, written straight into Redis where only the platform
should write: every one the admission and the run-once guard read is refused where it is
read (in its script or in Python), said once with its key and the fix, and the safe value
applies instead. Before, a quota of -1 or 0 held a tenant's items for ever and ``abc``
meant no limit without a word; an unknown breaker state acted as ``ramp``; a bucket in
absurd debt or a lease or holder that never expires held their items for ever.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import replace

import pytest
import redis
from redis.asyncio import Redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.scheduler.guard import RUN, TAKEN_OVER
from asynctier.scheduler.limits.breaker import Breakers
from asynctier.scheduler.limits.bucket import RedisBucket
from asynctier.scheduler.limits.concurrency import LeasePool
from asynctier.scheduler.limits.once import RunOnce
from asynctier.scheduler.limits.quota import QuotaStore, RedisQuota
from tests.helpers import MinuteClock
from tests.scheduler.test_limits_redis import make_items

BINDING = Binding(name="orders", source=Source("kafka", "orders"), function="app.jobs:handle",
                  tenant="acme")
#: How long a test waits for what must come at once (a hold for ever fails it).
PROMPT_S = 5.0


def refusals(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    """The log lines that refused a value of ``key``."""
    return [r.getMessage() for r in caplog.records
            if "a bad value in Redis" in r.getMessage() and key in r.getMessage()]


# -- quota ---------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["-1", "0", "abc", "2.5", "inf", "nan"])
def test_a_bad_quota_is_no_limit_on_its_window_said_once(
        raw: str, settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    key = QuotaStore(None, settings.names).key("acme")  # type: ignore[arg-type]
    redis_client.hset(key, mapping={"per_minute": raw, "per_day": "15"})

    async def scenario() -> list[int]:
        client = Redis.from_url(settings.redis_url)
        quota = RedisQuota(client, settings.names, clock=MinuteClock(1_000))
        try:
            overs = []
            for n in range(2):
                over = await quota.charge(BINDING, make_items(
                    [f"t/0/{n * 10 + i}" for i in range(10)], start_id=n * 10))
                overs.append(len(over))
            return overs
        finally:
            await client.aclose()

    # the bad per_minute is no limit; the good per_day still holds (15 of 20)
    assert asyncio.run(scenario()) == [0, 5]
    said = refusals(caplog, key)
    assert len(said) == 1, said  # once per bad value, not per call
    assert "per_minute" in said[0] and "asynctier quota set acme --per-minute N" in said[0]


def test_a_bad_usage_count_counts_as_0(settings: Settings, redis_client: redis.Redis,
                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    store = QuotaStore(None, settings.names)  # type: ignore[arg-type]
    clock = MinuteClock(1_000)
    redis_client.hset(store.key("acme"), "per_minute", 5)
    redis_client.hset(store.usage_key("acme"), mapping={"m": clock.minute, "mc": "-100"})

    async def scenario() -> int:
        client = Redis.from_url(settings.redis_url)
        quota = RedisQuota(client, settings.names, clock=clock)
        try:
            return len(await quota.charge(BINDING, make_items([f"t/0/{i}" for i in range(10)])))
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == 5  # not 110 admitted on a count of -100
    assert len(refusals(caplog, store.usage_key("acme"))) == 1


# -- breaker -------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [{"state": "bogus"},
                                    {"state": "ramp", "changed": "99999999999999"},
                                    {"state": "open", "ok": "-5"}])
def test_a_bad_breaker_starts_afresh_closed_said_once(
        fields: dict[str, str], settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    binding = BINDING.with_changes(breaker=replace(BINDING.breaker, ratio=0.5))

    async def scenario() -> tuple[int, int, str]:
        client = Redis.from_url(settings.redis_url)
        breakers = Breakers(client, settings.names)
        redis_client.hset(breakers.key(binding.name), mapping=fields)
        try:
            _, first = await breakers.admit(binding, make_items([f"t/0/{i}" for i in range(10)]))
            redis_client.hset(breakers.key(binding.name), mapping=fields)  # the same again
            _, second = await breakers.admit(binding, make_items([f"t/1/{i}" for i in range(10)]))
            return len(first), len(second), breakers.state(binding.name)
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (10, 10, "closed")  # not ramp's one, not parked
    said = refusals(caplog, settings.names.redis_key("breaker", binding.name))
    assert len(said) == 1 and "delete the key" in said[0], said


# -- token bucket ----------------------------------------------------------------------------


@pytest.mark.parametrize(("tokens", "ts"), [("-1e300", None), ("nan", None),
                                            ("0", "99999999999999999")])
def test_a_bad_bucket_starts_full_said_once(
        tokens: str, ts: str | None, settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    binding = BINDING.with_changes(limits=replace(BINDING.limits, rate_per_s=10.0, burst=100))

    async def scenario() -> list[float]:
        client = Redis.from_url(settings.redis_url)
        bucket = RedisBucket(client, settings.names)
        key = bucket.key(binding.name)
        seconds, micros = redis_client.time()  # type: ignore[misc]
        try:
            waits = []
            for _ in range(2):
                redis_client.hset(key, mapping={"tokens": tokens,
                                                "ts": ts or seconds * 1_000_000 + micros})
                waits.append(await bucket.reserve(binding, 5))
            return waits
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [0.0, 0.0]  # full: no wait for ever, no NaN
    assert len(refusals(caplog, settings.names.redis_key("rate", binding.name))) == 1


# -- concurrency leases ----------------------------------------------------------------------


@pytest.mark.parametrize("expiry", [math.inf, 4102444800000.0])
def test_a_lease_that_never_expires_is_dropped_said_once(
        expiry: float, settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    binding = BINDING.with_changes(limits=replace(BINDING.limits, max_concurrency=1))

    async def scenario() -> None:
        client = Redis.from_url(settings.redis_url)
        pool = LeasePool(client, settings.names)
        try:
            for _ in range(2):
                redis_client.zadd(pool.key(binding.name), {"ghost": expiry})
                async with asyncio.timeout(PROMPT_S):  # the cap of 1 was held for ever
                    lease, _ = await pool.acquire(binding)
                await pool.release(binding.name, lease)
        finally:
            await pool.close()
            await client.aclose()

    asyncio.run(scenario())
    said = refusals(caplog, settings.names.redis_key("leases", binding.name))
    assert len(said) == 1 and "ghost" in said[0], said


# -- run once --------------------------------------------------------------------------------


def _span_key(once: RunOnce, redis_client: redis.Redis, binding: str) -> str:
    seconds, micros = redis_client.time()  # type: ignore[misc]
    now_ms = seconds * 1000 + micros // 1000
    return once.prefix(binding) + str(now_ms // once._span_ms)


@pytest.mark.parametrize("value", ["x", "r", "", "done"])
def test_a_bad_run_once_value_runs_the_record_said_once(
        value: str, settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)

    async def scenario() -> tuple[str, str]:
        client = Redis.from_url(settings.redis_url)
        once = RunOnce(client, settings.names)
        span_key = _span_key(once, redis_client, "b")
        try:
            redis_client.hset(span_key, "t/0/1", value)
            first = await once.claim("b", make_items(["t/0/1"]))
            once.forget("b", make_items(["t/0/1"]))
            redis_client.hset(span_key, "t/0/1", value)
            second = await once.claim("b", make_items(["t/0/1"]))
            return first, second
        finally:
            await once.close()
            await client.aclose()

    assert asyncio.run(scenario()) == (RUN, RUN)  # not taken over from holder ''
    said = refusals(caplog, settings.names.once_key("b", ""))
    assert len(said) == 1 and "t/0/1" in said[0], said


def test_a_holder_that_never_expires_is_dropped_said_once(
        settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)

    async def scenario() -> str:
        client = Redis.from_url(settings.redis_url)
        once = RunOnce(client, settings.names)
        span_key = _span_key(once, redis_client, "b")
        try:
            redis_client.hset(span_key, "t/0/1", "rghost")
            redis_client.zadd(once.holders("b"), {"ghost": math.inf})
            return await once.claim("b", make_items(["t/0/1"]))
        finally:
            await once.close()
            await client.aclose()

    assert asyncio.run(scenario()) == TAKEN_OVER  # not BUSY for ever
    said = refusals(caplog, settings.names.once_key("b", "holders"))
    assert len(said) == 1 and "ghost" in said[0], said

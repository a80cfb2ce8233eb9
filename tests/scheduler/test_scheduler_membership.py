"""Scheduler membership in Redis: heartbeats, expiry, the directory tailers read."""

from __future__ import annotations

import asyncio
import threading
import time

import redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.binding_source import StaticBindings
from asynctier.platform.config import Settings
from asynctier.platform.membership import SchedulerDirectory, live_members, live_schedulers
from asynctier.scheduler.heartbeat import Heartbeat
from tests.helpers import until, wait_until
from tests.scheduler_harness import items, running_scheduler


def test_two_schedulers_register_and_a_dead_one_drops_out(settings: Settings,
                                                          redis_client: redis.Redis) -> None:
    async def scenario() -> float:
        one = Heartbeat(settings, "10.0.0.1:5001", lambda: 7, interval_s=0.2, ttl_s=1.5)
        two = Heartbeat(settings, "10.0.0.2:5001", lambda: 0, interval_s=0.2, ttl_s=1.5)
        one.start()
        two.start()
        both = {"10.0.0.1:5001": 7, "10.0.0.2:5001": 0}
        await until(lambda: {m.address: m.load for m in live_members(settings)} == both,
                    message="both schedulers registered with their loads")
        await two.stop(leave=False)  # dies: no goodbye, no more beats
        died = time.monotonic()
        while "10.0.0.2:5001" in live_schedulers(settings):
            assert time.monotonic() - died < 3.0, "a dead scheduler stayed listed"
            await asyncio.sleep(0.05)
        gone_after = time.monotonic() - died
        assert live_schedulers(settings) == ["10.0.0.1:5001"]
        await one.stop(leave=True)  # a clean stop leaves at once
        assert live_schedulers(settings) == []
        return gone_after

    gone_after = asyncio.run(scenario())
    print(f"\nthe dead scheduler dropped out {gone_after:.2f} s after its last beat (TTL 1.5 s)")
    assert gone_after <= 1.5 + 0.3


def test_a_running_scheduler_registers_its_real_port(settings: Settings) -> None:
    with running_scheduler(settings, []) as running:
        assert running.address.startswith("127.0.0.1:")
        assert not running.address.endswith(":0")
        assert live_schedulers(settings) == [running.address]
        directory = SchedulerDirectory(settings)
        assert directory.addresses() == [running.address]
        directory.close()
    assert live_schedulers(settings) == []  # left the membership when it stopped


def test_directory_falls_back_to_configured_schedulers(settings: Settings) -> None:
    configured = settings.with_overrides(schedulers=("127.0.0.1:50051",))
    directory = SchedulerDirectory(configured, cache_s=0.1)
    assert directory.addresses() == ["127.0.0.1:50051"]  # none registered
    directory.close()
    down = configured.with_overrides(redis_url="redis://127.0.0.1:1/0")  # nothing listens
    directory = SchedulerDirectory(down, cache_s=0.1)
    assert directory.addresses() == ["127.0.0.1:50051"]
    directory.close()


def test_directory_caches_for_about_a_second(settings: Settings) -> None:
    async def beat(address: str) -> None:
        heartbeat = Heartbeat(settings, address, lambda: 0)
        await heartbeat.beat()
        await heartbeat.stop(leave=False)

    directory = SchedulerDirectory(settings, cache_s=1.0)
    asyncio.run(beat("10.0.0.9:1"))
    assert directory.addresses() == ["10.0.0.9:1"]
    asyncio.run(beat("10.0.0.8:1"))
    assert directory.addresses() == ["10.0.0.9:1"]  # cached
    wait_until(lambda: directory.addresses() == ["10.0.0.8:1", "10.0.0.9:1"], 3,
               "the directory sees the second scheduler after its cache time")
    directory.close()


def test_heartbeat_survives_redis_being_unreachable(settings: Settings) -> None:
    down = settings.with_overrides(redis_url="redis://127.0.0.1:1/0")

    async def scenario() -> None:
        heartbeat = Heartbeat(down, "10.0.0.3:1", lambda: 0, interval_s=0.05)
        assert await heartbeat.beat() is False
        failed = []
        beat = heartbeat.beat

        async def counted() -> bool:
            ok = await beat()
            failed.append(not ok)
            return ok

        heartbeat.beat = counted  # type: ignore[method-assign]
        heartbeat.start()
        await until(lambda: len(failed) >= 3, message="the heartbeat tried again and again")
        assert all(failed)
        assert heartbeat._task is not None and not heartbeat._task.done()
        await heartbeat.stop(leave=True)

    asyncio.run(scenario())


def test_a_scheduler_serves_on_while_redis_is_unreachable(settings: Settings) -> None:
    down = settings.with_overrides(redis_url="redis://127.0.0.1:1/0")
    binding = Binding("rec", Source("kafka", "t"), "tests.funcs.basic:noop")
    with running_scheduler(down, [binding]) as running:
        outcomes = running.submit(items("rec", 100))
        assert all(o["status"] == "ok" for o in outcomes.values())


def test_a_busy_port_is_a_clear_error(settings: Settings) -> None:
    import pytest

    from asynctier.platform.errors import ServiceError

    with running_scheduler(settings, []) as running, pytest.raises(
            ServiceError, match="cannot listen on"):
        port = running.address.rsplit(":", 1)[1]
        from asynctier.scheduler import run_scheduler

        run_scheduler(settings, listen=f"127.0.0.1:{port}", bindings=StaticBindings([]),
                      stop=threading.Event())

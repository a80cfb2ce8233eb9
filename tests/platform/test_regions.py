"""Regions in the membership (real Redis): schedulers register region and capacity, the
directory places calls home first, ``asynctier schedulers`` lists them by region."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from click.testing import CliRunner

from asynctier.cli import main
from asynctier.platform.config import Settings
from asynctier.platform.membership import SchedulerDirectory, live_members, member_keys
from asynctier.scheduler.heartbeat import Heartbeat


@pytest.fixture
def settings(redis_url: str, prefix: str) -> Settings:
    """The session's Redis under this test's prefix (no Kafka needed here)."""
    return Settings(redis_url=redis_url, prefix=prefix)


def register(settings: Settings, members: list[tuple[str, str, int, int]],
             tier: str | None = None) -> None:
    """Beat once for each (address, region, load, capacity), kept for ``tier``; the beats
    stay for 5 s."""
    async def beat() -> None:
        for address, region, load, capacity in members:
            heartbeat = Heartbeat(settings.with_overrides(region=region), address,
                                  lambda n=load: n, capacity=capacity, tier=tier)
            await heartbeat.beat()
            await heartbeat.stop(leave=False)

    asyncio.run(beat())


def test_schedulers_register_region_and_capacity(settings: Settings) -> None:
    register(settings, [("10.0.0.1:1", "a", 3, 10), ("10.0.0.2:1", "b", 10, 10)])
    got = {(m.address, m.region, m.load, m.capacity) for m in live_members(settings)}
    assert got == {("10.0.0.1:1", "a", 3, 10), ("10.0.0.2:1", "b", 10, 10)}
    assert len({k.split("}")[0] for k in member_keys(settings)}) == 1  # one hash tag


def test_an_older_scheduler_without_a_place_is_in_the_default_region(
        settings: Settings, redis_client: redis.Redis) -> None:
    register(settings, [("10.0.0.3:1", "a", 1, 10)])
    redis_client.hdel(member_keys(settings)[2], "10.0.0.3:1")  # as an older version beats
    [member] = live_members(settings)
    assert (member.region, member.capacity, member.spot.full) == ("local", 0, False)


def test_entries_not_written_by_a_scheduler_are_left_out_and_said_once(
        settings: Settings, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """Anything may write to Redis: a made-up address or load is never dialled nor counted,
    a bad place falls back to the defaults, and the good members are still found."""
    register(settings, [("10.0.0.1:1", "a", 2, 10)])
    members, loads, places = member_keys(settings)
    far = 2_000_000_000_000  # an expiry long after the test
    redis_client.zadd(members, {"not an address": far, "10.0.0.9:99999": far,
                                "10.0.0.5:5": far, "10.0.0.6:6": far, "10.0.0.7:7": far})
    redis_client.hset(loads, mapping={"not an address": 1, "10.0.0.9:99999": 1,
                                      "10.0.0.5:5": "abc", "10.0.0.6:6": -3, "10.0.0.7:7": 4})
    redis_client.hset(places, "10.0.0.7:7", '{"region": 7, "capacity": "x"}')
    try:
        with caplog.at_level("ERROR", logger="asynctier.platform.membership"):
            first = live_members(settings)
            again = live_members(settings)
    finally:
        redis_client.zrem(members, "not an address", "10.0.0.9:99999", "10.0.0.5:5",
                          "10.0.0.6:6", "10.0.0.7:7")
    got = [(m.address, m.region, m.load, m.capacity) for m in first]
    assert got == [("10.0.0.1:1", "a", 2, 10), ("10.0.0.7:7", "local", 4, 0)]
    assert again == first
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4 and all("is ignored" in m for m in said), said


def test_the_directory_places_home_first_then_spills_then_leaves(settings: Settings) -> None:
    tailer = settings.with_overrides(region="a", spill_share=0.5, spill_window=4)
    register(settings, [("10.0.0.1:1", "a", 0, 10), ("10.0.0.2:1", "b", 0, 10)])
    directory = SchedulerDirectory(tailer, cache_s=0.0)
    assert [directory.place() for _ in range(4)] == [["10.0.0.1:1"]] * 4
    register(settings, [("10.0.0.1:1", "a", 10, 10)])  # home is full now
    assert [directory.place() for _ in range(4)] == [["10.0.0.2:1"]] * 2 + [["10.0.0.1:1"]] * 2
    assert directory.place(down={"10.0.0.1:1"}) == ["10.0.0.2:1"]  # home is down: away
    assert sorted(directory.addresses()) == ["10.0.0.1:1", "10.0.0.2:1"]
    directory.close()


def test_schedulers_command_lists_by_region(settings: Settings) -> None:
    register(settings, [("10.0.0.2:1", "b", 10, 10), ("10.0.0.1:1", "a", 3, 10)])
    env = {"ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix}
    runner = CliRunner()
    done = runner.invoke(main, ["schedulers", "--json"], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == [
        {"region": "a", "address": "10.0.0.1:1", "tier": "all", "load": 3, "capacity": 10,
         "free": 7, "full": False},
        {"region": "b", "address": "10.0.0.2:1", "tier": "all", "load": 10, "capacity": 10,
         "free": 0, "full": True}]
    table = runner.invoke(main, ["schedulers"], env=env)
    assert table.exit_code == 0, table.output
    assert "full" in table.output and "region a: 1 scheduler(s), load 3 of 10" in table.output


def test_tailers_of_a_tier_send_to_its_schedulers_first_then_to_any(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A scheduler kept for a tier (``run scheduler --tier``) gets that tier's calls while
    it lives and has room; the other tiers' calls (and a tailer of every tier) go to the
    schedulers of every tier; a tier whose own schedulers are down or full falls back to
    them, and with none of those either, to any. A tier this version does not know reads
    as every tier."""
    register(settings, [("10.0.0.1:1", "a", 0, 10)])
    register(settings, [("10.0.0.2:1", "a", 0, 10)], tier="urgent")
    urgent = SchedulerDirectory(settings.with_overrides(region="a"), cache_s=0.0,
                                tier="urgent")
    batch = SchedulerDirectory(settings.with_overrides(region="a"), cache_s=0.0,
                               tier="batch")
    every = SchedulerDirectory(settings.with_overrides(region="a"), cache_s=0.0)
    try:
        assert {(m.address, m.tier) for m in live_members(settings)} == {
            ("10.0.0.1:1", None), ("10.0.0.2:1", "urgent")}
        assert urgent.place() == ["10.0.0.2:1"]
        assert batch.place() == every.place() == ["10.0.0.1:1"]
        assert urgent.place(down={"10.0.0.2:1"}) == ["10.0.0.1:1"]  # its own is down
        assert batch.place(down={"10.0.0.1:1"}) == ["10.0.0.2:1"]  # none other is up
        places = member_keys(settings)[2]
        redis_client.hset(places, "10.0.0.2:1", '{"region": "a", "capacity": 10, '
                                                '"tier": "someday"}')
        assert sorted(urgent.place()) == ["10.0.0.1:1", "10.0.0.2:1"]
        register(settings, [("10.0.0.2:1", "a", 10, 10)], tier="urgent")  # it is full
        assert urgent.place() == ["10.0.0.1:1"]
    finally:
        for directory in (urgent, batch, every):
            directory.close()

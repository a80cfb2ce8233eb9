"""Pausing a binding on real processes: `asynctier pause` stops its tailer (the group has no
member left), records produced meanwhile wait in the topic, a retry that comes due on the
ladder goes back one hop with its attempt unspent; `asynctier resume` drains them all."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from asynctier.platform.config import Settings
from asynctier.platform.paused import PauseFollower, PauseStore, read_pause
from tests.funcs import ledger
from tests.helpers import wait_until
from tests.platform_harness import Platform, committed_vs_end, produce_json

#: The ladder's one hop: long enough for the pause to be read before the retry is due.
LADDER = "10s"


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    plat = Platform(settings, tmp_path, allow=("tests.funcs.ledger",))
    yield plat
    plat.stop_all()


def tailer_state(plat: Platform, name: str) -> str:
    rows = json.loads(plat.cli("bindings", "--json").stdout)
    return str(next(r["tailer"] for r in rows if r["name"] == name))


def members(admin: AdminClient, group: str) -> int:
    (future,) = admin.describe_consumer_groups([group], request_timeout=10).values()
    return len(future.result().members)


def attempts(plat: Platform) -> Counter[int]:
    """Calls per id so far."""
    return Counter(c.id for c in ledger.read(plat.ledger))


def test_a_paused_binding_holds_its_records_and_retries_until_resumed(
        platform: Platform, settings: Settings, unique_topic: Callable[..., str],
        kafka_admin: AdminClient) -> None:
    plat, topic, group = platform, unique_topic(2), settings.names.group("paced")
    plat.cli("bind", "paced", "--topic", topic, "--function", "tests.funcs.ledger:record",
             "--retry-ladder", LADDER, "--max-attempts", "3")
    for component in ("scheduler", "tailers", "delay"):
        plat.start(component)
    wait_until(lambda: ": assigned " in plat.log("tailers", 100_000), 60, "tailers ready")
    # id 0 fails its first attempt: its retry waits on the ladder while the binding pauses
    produce_json(settings, topic, [{"id": 0, "fail_until": 2},
                                   *({"id": i} for i in range(1, 10))], key_of="id")
    wait_until(lambda: set(attempts(plat)) == set(range(10)), 30, "the first ten ran once")

    assert "paused paced" in plat.cli("pause", "paced").stdout
    wait_until(lambda: tailer_state(plat, "paced") == "paused", 15, "bindings shows paused")
    wait_until(lambda: members(kafka_admin, group) == 0, 30, "the tailer left its group")
    produce_json(settings, topic, [{"id": i} for i in range(10, 30)], key_of="id")
    wait_until(lambda: "binding paced is paused: its due retries go back one hop"
               in plat.log("delay", 100_000), 30, "the due retry held")
    # nothing consumes the topic (no member) and the held retry spent no attempt
    assert attempts(plat) == Counter(range(10))
    assert committed_vs_end(settings, group, topic) == (10, 30)

    assert "resumed paced" in plat.cli("resume", "paced").stdout
    wait_until(lambda: set(attempts(plat)) == set(range(30)) and attempts(plat)[0] == 2,
               60, "every record ran after the resume, id 0 on its second attempt")
    wait_until(lambda: committed_vs_end(settings, group, topic) == (30, 30), 30,
               "the group committed the whole topic")
    assert tailer_state(plat, "paced") == "running"
    assert attempts(plat) == Counter({0: 2, **dict.fromkeys(range(1, 30), 1)})
    assert "was not paused" in plat.cli("resume", "paced").stdout
    refused = plat.cli("pause", "nosuch", check=False)
    assert refused.returncode != 0 and "no binding 'nosuch'" in refused.stderr


def test_a_pause_value_that_does_not_read_still_pauses() -> None:
    good = read_pause("b", json.dumps({"since_ms": 5, "by": "cli:ann"}).encode())
    assert (good.since_ms, good.by, good.note) == (5, "cli:ann", "")
    for raw in (b"yes", b"{}", b'{"since_ms": -1, "by": "x"}', b'{"since_ms": "5", "by": 1}',
                b'{"since_ms": true, "by": "x"}'):
        bad = read_pause("b", raw)
        assert bad.binding == "b" and bad.since_ms is None and "unreadable value" in bad.note


def test_the_follower_says_each_change_once_and_keeps_the_set_through_an_outage(
        settings: Settings) -> None:
    seen: list[frozenset[str]] = []
    follower = PauseFollower(settings, seen.append)
    try:
        follower.store.pause("b1", "test")
        assert follower.read_once() == {"b1"}
        assert follower.read_once() == {"b1"} and seen == [{"b1"}]
        follower.store._client.hset(follower.store.key, "b2", "not json")
        assert follower.read_once() == {"b1", "b2"}
        follower.store.resume("b1")
        follower.store.resume("b2")
        assert follower.read_once() == frozenset() and seen[-1] == frozenset()
        follower.store.pause("b3", "test")
        follower.read_once()
        follower.store.resume("b3")
        follower.close()
        follower.store = PauseStore(dataclasses.replace(settings,
                                                        redis_url="redis://127.0.0.1:1/0"))
        assert follower.read_once() == {"b3"}  # Redis away: the last set read holds
        assert seen[-1] == {"b3"}
    finally:
        follower.close()

"""Deadlines and expiry on real processes: Kafka, Redis, ``asynctier run`` subprocesses.

Long (``--long``): each starts the platform's processes (twice for the expiry run) and
waits for their consumer groups; minutes on a busy machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from asynctier.platform.config import Settings
from tests.funcs.deadline import starts
from tests.helpers import wait_until
from tests.platform_harness import Platform, cli_in_process, produce_json


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.deadline",))
    yield plat
    plat.stop_all()


def _workers(platform: Platform, workers: int) -> None:
    """Give the scheduler ``workers`` workers through the config file's [scheduler]."""
    path = platform.config_file()
    path.write_text(path.read_text() + f"\n[scheduler]\nworkers = {workers}\n")


def _assigned(platform: Platform, name: str) -> None:
    """Wait until the tailers process ``name`` holds its partitions (records made before
    that would age in the topic while its consumer group forms)."""
    wait_until(lambda: ": assigned " in platform.log(name, 100_000), 60,
               f"{name} got its partitions")


def _dead(platform: Platform, binding: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(
        platform.cli("dlq", "list", binding, "--json").stdout or "[]")
    return rows


def test_records_already_past_their_expiry_are_dead_letters_and_never_run(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    """The short variant (default suite): no stop and restart; 10 of the 20 records carry
    a Kafka timestamp a minute old, past ``--expire-after 2s`` when they are read."""
    topic = unique_topic(2)
    cli_in_process(platform, "bind", "exp", "--topic", topic, "--function",
                   "tests.funcs.deadline:note", "--expire-after", "2s")
    platform.start("scheduler")
    platform.start("tailers")
    _assigned(platform, "tailers")  # the fresh records must not age 2 s meanwhile
    producer = Producer(settings.kafka_config())
    old_ms = int((time.time() - 60) * 1000)
    for i in range(20):
        stamp = {"timestamp": old_ms} if i % 2 else {}  # else now
        producer.produce(topic, json.dumps({"id": i}).encode(), str(i).encode(), **stamp)
    assert producer.flush(30) == 0
    wait_until(lambda: len(starts(platform.ledger)) >= 10, 60, "the fresh records ran")
    def dead() -> list[dict[str, object]]:
        rows: list[dict[str, object]] = json.loads(
            cli_in_process(platform, "dlq", "list", "exp", "--json") or "[]")
        return rows

    letters = wait_until(lambda: len(dead()) >= 10 and dead(), 30, "10 expired dead letters")
    assert {int(str(r["key"])) for r in letters} == set(range(1, 20, 2))
    assert {r["reason"] for r in letters} == {"expired"}
    assert {s.id for s in starts(platform.ledger)} == set(range(0, 20, 2))  # never ran


@pytest.mark.slow
def test_records_past_their_expiry_are_dead_letters_and_never_run(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    topic = unique_topic(2)
    platform.cli("bind", "exp", "--topic", topic, "--function", "tests.funcs.deadline:note",
                 "--expire-after", "2s")
    platform.start("scheduler")
    platform.start("tailers")
    _assigned(platform, "tailers")
    produce_json(settings, topic, [{"id": i} for i in range(20)], key_of="id")
    wait_until(lambda: len(starts(platform.ledger)) >= 20, 30, "the first 20 ran")
    platform.stop("tailers")
    platform.stop("scheduler")
    stopped_at = time.time()
    produce_json(settings, topic, [{"id": i} for i in range(20, 50)], key_of="id")
    # the platform stays stopped for 5 s: the 30 records made meanwhile pass their 2 s
    wait_until(lambda: time.time() - stopped_at >= 5.0, 10, "5 s stopped", interval=0.2)
    platform.start("scheduler", "scheduler-2")
    platform.start("tailers", "tailers-2")
    _assigned(platform, "tailers-2")
    produce_json(settings, topic, [{"id": i} for i in range(50, 70)], key_of="id")
    wait_until(lambda: {s.id for s in starts(platform.ledger)} >= set(range(50, 70)), 30,
               "the records made after the restart ran")
    dead = wait_until(lambda: len(_dead(platform, "exp")) >= 30 and _dead(platform, "exp"),
                      30, "30 expired dead letters")
    ran = {s.id for s in starts(platform.ledger)}
    assert {int(str(r["key"])) for r in dead} == set(range(20, 50))
    assert {r["reason"] for r in dead} == {"expired"}
    assert ran == set(range(20)) | set(range(50, 70))  # an expired record never ran
    print(f"\n{len(dead)} expired dead letters, {len(ran)} records ran")


@pytest.mark.slow
def test_near_deadlines_start_within_their_window_while_far_work_waits_then_completes(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    """Two bindings, one tenant, one tier, a scheduler of 2 workers: B's backlog would take
    5 s; A's records, made at 40/s meanwhile, must each start within A's 1 s window."""
    near, far = unique_topic(1), unique_topic(1)
    _workers(platform, 2)
    fn = "tests.funcs.deadline:note"
    platform.cli("bind", "near", "--topic", near, "--function", fn, "--start-within", "1s")
    platform.cli("bind", "far", "--topic", far, "--function", fn, "--start-within", "1h")
    n_far, n_near = 1000, 100
    produce_json(settings, far, [{"id": i, "sleep": 0.01} for i in range(n_far)])
    platform.start("scheduler")
    platform.start("tailers")
    _assigned(platform, "tailers")
    wait_until(lambda: any(s.binding == "far" for s in starts(platform.ledger)), 30,
               "the far backlog started")
    began = time.monotonic()
    for i in range(n_near):  # paced: 40 records a second, below the capacity of 200/s
        produce_json(settings, near, [{"id": i, "sleep": 0.01}])
        wait_until(lambda i=i: time.monotonic() - began >= (i + 1) / 40, 5, "pace",  # type: ignore[misc]
                   interval=0.005)
    wait_until(lambda: sum(s.binding == "near" for s in starts(platform.ledger)) >= n_near,
               30, "every near record ran")
    far_running_at_end = sum(s.binding == "far" for s in starts(platform.ledger))
    wait_until(lambda: sum(s.binding == "far" for s in starts(platform.ledger)) >= n_far,
               60, "the far backlog completed")
    got = starts(platform.ledger)
    delays = sorted(s.delay_s for s in got if s.binding == "near")
    p99 = delays[int(len(delays) * 0.99) - 1]
    print(f"\nnear: p99 start delay {p99 * 1000:.0f} ms (window 1 s), max "
          f"{delays[-1] * 1000:.0f} ms; far: {far_running_at_end} of {n_far} started while "
          f"near ran, all {n_far} completed")
    assert p99 < 1.0, delays[-10:]
    assert far_running_at_end < n_far  # capacity was short: the far work waited
    assert all(abs(s.deadline - (s.record_time + 1.0)) < 0.01 for s in got
               if s.binding == "near")  # ctx.deadline is the record's deadline

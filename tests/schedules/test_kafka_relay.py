"""Kafka-target schedules on a real PostgreSQL and Kafka: each tick written to its Kafka topic
once, by one relay per shard, including when a relay dies between its Kafka commit and
its ack; an outbox item without a topic is buried, not relayed."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Message, TopicPartition

from asynctier.cli import main
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue import NewItem
from asynctier.queue.items import Leased
from asynctier.queue.shards import ShardedQueue
from asynctier.schedules import Schedule, ScheduleStore
from asynctier.schedules.loop import ScheduleLoop
from asynctier.schedules.relay import H_TICK, KafkaRelay
from asynctier.schedules.spec import OUTBOX_TOPIC
from tests.helpers import wait_until
from tests.queue.test_queue_e2e import QueuePlatform


@pytest.fixture
def queue(postgres: str) -> Iterator[ShardedQueue]:
    with ShardedQueue([postgres], pool_size=4) as q:
        q.stores[0].migrate()
        yield q


class Running:
    """Loops in threads of this process, stopped at the end."""

    def __init__(self) -> None:
        self.stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(self, run: Callable[[threading.Event], None]) -> threading.Thread:
        stop = threading.Event()
        thread = threading.Thread(target=run, args=(stop,), daemon=True)
        thread.start()
        self.stops.append((stop, thread))
        return thread

    def stop_all(self) -> None:
        for stop, _ in self.stops:
            stop.set()
        for _, thread in self.stops:
            thread.join(40)


@pytest.fixture
def running() -> Iterator[Running]:
    loops = Running()
    yield loops
    loops.stop_all()


def outbox(queue: ShardedQueue, ns: str) -> tuple[int, int]:
    """(ready, leased) items of the namespace's outbox."""
    counts = queue.counts(ns, OUTBOX_TOPIC)
    return (counts[0].ready, counts[0].leased) if counts else (0, 0)


def committed(settings: Settings, topic: str) -> list[Message]:
    """Every committed record of ``topic`` (one partition), read to its end. The end is
    past the transactions' commit markers, so it is reached by the position, not by the
    last record's offset."""
    consumer = Consumer(settings.kafka_config(**{
        "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed"}))
    part = TopicPartition(topic, 0, 0)
    _, end = consumer.get_watermark_offsets(part, timeout=10)
    consumer.assign([part])
    out: list[Message] = []
    deadline = time.monotonic() + 10
    while consumer.position([part])[0].offset < end and time.monotonic() < deadline:
        out += [m for m in consumer.consume(500, 0.2) if m.error() is None]
    consumer.close()
    return out


def ticks(settings: Settings, topic: str) -> Counter[str]:
    """How many records of each tick id ``topic`` holds."""
    return Counter(dict(m.headers() or [])[H_TICK].decode() for m in committed(settings, topic))


def test_each_tick_of_a_kafka_target_schedule_is_written_once(
        settings: Settings, queue: ShardedQueue, queue_namespace: str,
        unique_topic: Callable[..., str], running: Running) -> None:
    topic = unique_topic(1)
    store = ScheduleStore(queue)
    store.add(Schedule(namespace=queue_namespace, name="beat", topic=topic, every_s=1,
                       payload='{"kind": "beat"}', target="kafka"))
    relay = KafkaRelay(settings, queue.routes[0])
    running.start(relay.run)
    running.start(ScheduleLoop(queue, namespaces=[queue_namespace]).run)
    wait_until(lambda: relay.relayed >= 3, 30, "three ticks relayed")
    store.pause(queue_namespace, "beat")
    info = store.get(queue_namespace, "beat")
    assert info is not None
    wait_until(lambda: relay.relayed >= info.fired, 10, "every fired tick relayed")
    seen = ticks(settings, topic)
    assert set(seen.values()) == {1} and len(seen) == info.fired, seen
    records = committed(settings, topic)
    doc = json.loads(records[0].value() or b"")
    assert doc["kind"] == "beat" and doc["schedule"] == "beat" and "tick_ms" in doc
    assert records[0].key() == b"beat"
    assert outbox(queue, queue_namespace) == (0, 0)


def test_a_relay_that_dies_after_its_commit_writes_no_tick_twice(
        settings: Settings, queue: ShardedQueue, queue_namespace: str,
        unique_topic: Callable[..., str], running: Running,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first relay dies between its Kafka commit and its ack (its lease still held, its
    lock gone with it); the next one acks that batch from the progress record instead of
    writing it again, then relays the rest."""
    topic = unique_topic(1)
    items = [NewItem(OUTBOX_TOPIC, b'{"n": %d}' % n, id=f"t{n}",
                     headers=((("asynctier.kafka-topic", topic.encode()),)))
             for n in range(5)]
    queue.enqueue(queue_namespace, items)

    class Died(Exception):
        pass

    def die(batch: list[tuple[str, Leased]]) -> None:
        raise Died(f"after the commit of {len(batch)}")

    first = KafkaRelay(settings, queue.routes[0], batch=3, after_commit=die)
    with pytest.raises(Died):
        first.run(threading.Event())
    assert sum(ticks(settings, topic).values()) == 3, "its batch is in Kafka"
    assert outbox(queue, queue_namespace) == (2, 3), "and not acked"

    queue.enqueue(queue_namespace, [NewItem(OUTBOX_TOPIC, b"{}", id="t5",
                                            headers=(("asynctier.kafka-topic", topic.encode()),
                                                     ("asynctier.kafka-key", b"k")))])
    second = KafkaRelay(settings, queue.routes[0], batch=3)
    running.start(second.run)
    wait_until(lambda: sum(ticks(settings, topic).values()) >= 6, 30, "the rest relayed")
    seen = ticks(settings, topic)
    assert seen == Counter({f"t{n}": 1 for n in range(6)}), seen
    assert second.relayed == 3
    assert "acked now, not written again" in caplog.text
    wait_until(lambda: outbox(queue, queue_namespace) == (0, 0), 10, "the outbox empty")


def test_one_relay_per_shard_and_a_bad_outbox_item_is_buried(
        settings: Settings, queue: ShardedQueue, queue_namespace: str,
        running: Running) -> None:
    a, b = KafkaRelay(settings, queue.routes[0]), KafkaRelay(settings, queue.routes[0])
    running.start(a.run)
    wait_until(lambda: a.leading, 30, "the first relay leads")
    running.start(b.run)
    queue.enqueue(queue_namespace, [NewItem(OUTBOX_TOPIC, b"{}", id="lost",
                                            headers=(("asynctier.kafka-topic", b"no way"),))])
    wait_until(lambda: bool(queue.dead_items(queue_namespace, OUTBOX_TOPIC)), 10,
               "the bad item buried")
    [dead] = queue.dead_items(queue_namespace, OUTBOX_TOPIC)
    assert dead.id == "lost" and dead.reason == "undecodable"
    assert not b.leading, "the second relay waits for the shard's lock"


def test_the_cli_adds_a_kafka_target_and_refuses_two_targets(
        settings: Settings, postgres: str, queue: ShardedQueue, queue_namespace: str,
        unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    env = {"ASYNCTIER_CONFIG": "", "ASYNCTIER_QUEUE_SHARDS": postgres,
           "ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix}
    ns = ["-n", queue_namespace]
    run = CliRunner().invoke
    both = run(main, ["schedule", "add", "x", *ns, "--every", "5s", "--queue", "q", "--topic",
                      topic], env=env)
    assert both.exit_code == 2 and "give exactly one of --queue TOPIC" in both.output
    unbound = run(main, ["schedule", "add", "x", *ns, "--every", "5s", "--topic", topic],
                  env=env)
    assert unbound.exit_code == 2 and f"no binding reads Kafka topic {topic!r}" in unbound.output
    BindingRegistry(settings).put(Binding("beats", Source("kafka", topic), "m:f"))
    added = run(main, ["schedule", "add", "x", *ns, "--every", "5s", "--topic", topic], env=env)
    assert added.exit_code == 0, added.output
    assert f"-> Kafka topic {topic}" in added.output
    [doc] = json.loads(run(main, ["schedule", "list", *ns, "--json"], env=env).output)
    assert (doc["target"], doc["topic"]) == ("kafka", topic)
    info = ScheduleStore(queue).get(queue_namespace, "x")
    assert info is not None and info.schedule is not None
    assert info.schedule.queue_topic == OUTBOX_TOPIC
    ScheduleStore(queue).remove(queue_namespace, "x")


def test_ticks_run_once_through_the_platform_with_its_tailers_killed(
        settings: Settings, postgres: str, queue_namespace: str, tmp_path: Path,
        unique_topic: Callable[..., str]) -> None:
    """A Kafka-target schedule ticking every second, fired and relayed by the tailers
    process (killed with SIGKILL twice, started again), run by a Kafka binding: each tick
    that ran ran once, with its own payload."""
    topic = unique_topic(1)
    plat = QueuePlatform(settings, tmp_path, [postgres])
    plat.allow = ["tests.funcs.shapes"]
    try:
        plat.cli("bind", "beats", "--topic", topic, "--function", "tests.funcs.shapes:keep")
        plat.cli("schedule", "add", "beat", "-n", queue_namespace, "--every", "1s",
                 "--topic", topic, "--catch-up", "all")
        plat.start("scheduler")
        for round_ in range(3):
            plat.start("tailers")
            wait_until(lambda r=round_: len(runs(plat.ledger)) >= 3 * (r + 1), 60,  # type: ignore[misc]
                       f"ticks ran (round {round_})")
            if round_ < 2:
                plat.kill("tailers")
        plat.cli("schedule", "pause", "beat", "-n", queue_namespace)
    finally:
        plat.stop_all()
    ran = runs(plat.ledger)
    assert set(Counter(doc["payload"]["tick"] for doc in ran).values()) == {1}, ran
    assert all(doc["key"] == "beat" for doc in ran)


def runs(ledger: Path) -> list[dict[str, Any]]:
    """Every call the ledger holds, in order (``tests.funcs.shapes:keep``)."""
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line]

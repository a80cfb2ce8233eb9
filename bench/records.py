"""The records every contender works on, and reading a consumer group's progress.

A record is about 100 bytes of JSON: ``{"id": i, "t0": <producer time, epoch s>, "pad":
"..."}``. :func:`preload` writes N of them round-robin into the partitions of a fresh
topic; :func:`open_loop` produces at a fixed rate for latency runs (each record's ``t0`` is
the time it was *due*, so a producer that falls behind shows up as latency, not hidden).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from asynctier.platform.kafka import ensure_topics

RECORD_BYTES = 100
PARTITIONS = 4


def record(i: int, t0: float, **extra: object) -> bytes:
    """One record of about :data:`RECORD_BYTES` bytes."""
    if not extra:  # the open-loop producer's case, written without json.dumps: at 40,000
        # records/s the producer shares the 2 cores with everything it measures
        head = f'{{"id":{i},"t0":{round(t0, 6)!r},"pad":"'
        return f'{head}{"x" * max(0, RECORD_BYTES - len(head) - 2)}"}}'.encode()
    doc: dict[str, object] = {"id": i, "t0": round(t0, 6), **extra, "pad": ""}
    size = len(json.dumps(doc, separators=(",", ":")))
    doc["pad"] = "x" * max(0, RECORD_BYTES - size)
    return json.dumps(doc, separators=(",", ":")).encode()


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    """Create ``topic`` (kept as it is when it exists)."""
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), {topic: (partitions, {})})


def _producer(bootstrap: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, **extra})


def key_of(i: int) -> bytes:
    """The key of record ``i`` of a keyed preload: 50,000 customers, in no order."""
    return b"customer-%d" % (i * 7919 % 50_000)


def _produce(producer: Producer, topic: str, value: bytes, partition: int,
             key: bytes | None = None, headers: list[tuple[str, bytes]] | None = None) -> None:
    while True:
        try:
            producer.produce(topic, value, key, partition=partition, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)


def preload(bootstrap: str, topic: str, n: int, partitions: int = PARTITIONS,
            keyed: bool = False, **extra: object) -> float:
    """Create ``topic`` and write ``n`` records (with ``extra`` fields; with a key each,
    :func:`key_of`, when ``keyed``) into it; returns the seconds it took."""
    create_topic(bootstrap, topic, partitions)
    started = time.monotonic()
    producer = _producer(bootstrap, **{"linger.ms": 50, "batch.size": 1_000_000,
                                       "compression.type": "none"})
    for i in range(n):
        _produce(producer, topic, record(i, time.time(), **extra), i % partitions,
                 key_of(i) if keyed else None)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"preloading {topic}: records left undelivered")
    return time.monotonic() - started


def warm_producer(bootstrap: str, topic: str, n: int, partitions: int = PARTITIONS) -> Producer:
    """A producer with librdkafka's default settings, connected and warmed up by ``n``
    records marked ``warmup`` (delivered before it is returned)."""
    producer = _producer(bootstrap)
    for i in range(n):
        _produce(producer, topic, record(i, time.time(), warmup=True), i % partitions)
    if producer.flush(60) != 0:
        raise RuntimeError(f"warming up a producer on {topic}: records left undelivered")
    return producer


def open_loop(producer: Producer, topic: str, rate: float, seconds: float,
              partitions: int = PARTITIONS,
              headers_of: Callable[[int], list[tuple[str, bytes]]] | None = None) -> int:
    """Produce at ``rate`` records/s for ``seconds``; returns how many were produced.
    ``headers_of(n)``: the headers of record ``n`` (called as it is produced)."""
    start = time.time()
    total = int(rate * seconds)
    sent = 0
    while sent < total:
        now = time.time()
        due = min(total, int((now - start) * rate) + 1)
        while sent < due:
            _produce(producer, topic, record(sent, start + sent / rate), sent % partitions,
                     headers=headers_of(sent) if headers_of else None)
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    if producer.flush(60) != 0:
        raise RuntimeError(f"open-loop producer on {topic}: records left undelivered")
    return sent


class GroupProgress:
    """How far a consumer group has committed on a topic (sum over its partitions)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.topic = topic
        self.group = group
        self._bootstrap = bootstrap
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                   "enable.auto.commit": False})
        meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
        self._parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]

    def committed(self) -> int:
        """Records committed so far (the sum of committed offsets).

        A broker that has just started may not have elected the group's coordinator yet
        (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS): asked again, for up to 30 s.
        """
        deadline = time.monotonic() + 30.0
        while True:
            try:
                found = self._consumer.committed(self._parts, timeout=10)
                return sum(max(tp.offset, 0) for tp in found)
            except KafkaException as exc:
                retriable = exc.args[0].code() in (KafkaError.NOT_COORDINATOR,
                                                   KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                                   KafkaError.COORDINATOR_NOT_AVAILABLE)
                if not retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def settled(self, members: int) -> bool:
        """True when the group is stable with ``members`` members that hold every
        partition between them (no rebalance under way: records are read at once)."""
        admin = AdminClient({"bootstrap.servers": self._bootstrap})
        try:
            group = admin.describe_consumer_groups([self.group])[self.group].result(timeout=10)
        except KafkaException:
            return False
        held = sum(len(m.assignment.topic_partitions) for m in group.members
                   if m.assignment is not None)
        return (group.state == ConsumerGroupState.STABLE and len(group.members) == members
                and held == len(self._parts))

    def end(self) -> int:
        """The sum of the partitions' end offsets."""
        return sum(self._consumer.get_watermark_offsets(tp, timeout=10)[1]
                   for tp in self._parts)

    def close(self) -> None:
        """Close the reading consumer."""
        self._consumer.close()


def read_messages(bootstrap: str, topic: str, n: int,
                  timeout_s: float = 60.0) -> list[Any]:
    """The first ``n`` records of ``topic`` (all partitions), as confluent-kafka Messages."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-feed-{time.time()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < n and time.monotonic() < deadline:
            messages += [msg for msg in consumer.consume(min(1000, n - len(messages)), 0.5)
                         if msg.error() is None]
    finally:
        consumer.close()
    if len(messages) < n:
        raise RuntimeError(f"read only {len(messages)} of {n} records from {topic}")
    return messages


def read_values(bootstrap: str, topic: str, n: int, timeout_s: float = 60.0) -> list[bytes]:
    """The first ``n`` record values of ``topic`` (all partitions), for the peers' feeders."""
    return [msg.value() or b"" for msg in read_messages(bootstrap, topic, n, timeout_s)]

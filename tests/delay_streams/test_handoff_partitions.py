"""Where delay records go on the real broker: one partition of the delay topic per hand-off
cycle (a tailer's batch), keys and all, whatever the keys; and a partition the topic does
not have falls back to any partition instead of failing the hand-off."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from asynctier.delay_streams.handoff import Handoff
from asynctier.delay_streams.topics import DELAY_PARTITIONS, ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.kafka import ConfirmingProducer
from asynctier.platform.wire import retry
from tests.platform_harness import read_topic


class _Read:
    """A record as a tailer reads it (what resolve_messages uses of one)."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return b'{"n": %d}' % self._offset

    def key(self) -> bytes:
        return b"customer-%d" % (self._offset * 7919 % 1000)

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)  # TIMESTAMP_CREATE_TIME


def test_each_cycle_of_keyed_records_goes_to_one_partition(settings: Settings) -> None:
    binding = Binding("orders", Source("kafka", f"{settings.prefix}.src"),
                      "tests.funcs.basic:record", retries=Retries(ladder_s=(30.0,)))
    ensure_binding_topics(settings, [binding])
    handoff = Handoff(settings)
    cycles = 3
    for cycle in range(cycles):
        messages: list[Any] = [_Read(cycle * 100 + i) for i in range(100)]
        counts = handoff.resolve_messages(binding, messages,
                                          [retry(i, "RuntimeError: boom") for i in range(100)])
        assert counts["retry"] == 100
        handoff.confirm()
    handoff.producer.close()
    got = read_topic(settings, settings.names.delay_topic("30s"))
    assert len(got) == 100 * cycles
    by_partition: dict[int, set[int]] = defaultdict(set)
    for msg in got:
        n = int(msg.value().decode().split()[1].rstrip("}"))  # type: ignore[attr-defined]
        assert msg.key() == _Read(n).key()  # type: ignore[attr-defined]
        by_partition[msg.partition()].add(n // 100)  # type: ignore[attr-defined]
    # three cycles, three partitions next to each other (round the topic's 8)
    assert sorted(len(c) for c in by_partition.values()) == [1] * cycles
    first = min(by_partition, key=lambda p: min(by_partition[p]))
    assert {(first + c) % DELAY_PARTITIONS for c in range(cycles)} == set(by_partition)


def test_a_partition_the_topic_lacks_falls_back_to_any(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(2)
    producer = ConfirmingProducer(settings)
    assert producer.partition_count(topic) == 2  # the client now knows the topic
    assert producer.partition_count(f"{topic}-missing", timeout_s=5.0) is None
    producer.produce(topic, b"v", b"k", [("h", b"1")], partition=5)
    producer.confirm()
    producer.close()
    got = read_topic(settings, topic)
    assert [(m.value(), m.key(), m.partition() in (0, 1)) for m in got] == [  # type: ignore[attr-defined]
        (b"v", b"k", True)]

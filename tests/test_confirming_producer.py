"""The hand-off producer's look without waiting (real Kafka): ``delivered()`` is False while
records travel and True once they are all acknowledged; a record the broker refuses makes
it raise, like ``confirm()``, instead of ever answering True."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError
from asynctier.platform.kafka import ConfirmingProducer
from tests.helpers import wait_until


def test_delivered_turns_true_once_every_record_is_acknowledged(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(2)
    producer = ConfirmingProducer(settings, **{"linger.ms": 200})
    producer.produce(topic, b"warm-up")
    producer.confirm()
    started = time.monotonic()
    for i in range(500):
        producer.produce(topic, str(i).encode())
    assert producer.delivered() is False  # lingering for 200 ms: none can have landed yet
    assert time.monotonic() - started < 0.15, "delivered() waited"
    wait_until(producer.delivered, 30, "the 500 records were never all delivered")
    assert _end_offsets(settings, topic) == 501


def _end_offsets(settings: Settings, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "unused"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    finally:
        consumer.close()


def test_delivered_raises_when_the_broker_refuses_a_record(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    producer = ConfirmingProducer(settings)
    producer.produce(topic, os.urandom(2 << 20))  # over the broker's message.max.bytes,
    # even compressed
    with pytest.raises(HandoffError, match="delivery failure"):
        wait_until(producer.delivered, 30, "the refused record was never reported")
    producer.close()

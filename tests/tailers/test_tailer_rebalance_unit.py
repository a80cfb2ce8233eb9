"""The tailer loop when a rebalance callback runs inside the consumer's call, and when it
stops with an unconfirmed hand-off (pure logic: the tailers are built through their
constructors with a recording consumer that serves the callbacks the way librdkafka does,
from inside the call, a Handoff on a recording producer, and a scheduler client whose calls
the test answers). The records of a partition revoked there are not run by this tailer (its
new owner runs them), and the records the consumer returned are not dropped when a
partition is lost; a stop during a refused hand-off commits nothing. The real rebalances and
hand-offs are exercised by tests/faults."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from asynctier.delay_streams.bookkeeping import BindingBook
from asynctier.delay_streams.handoff import Handoff
from asynctier.platform import names as n
from asynctier.platform import wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import SchedulerUnavailable
from asynctier.tailers.delay import DelayOptions, DelayTailer
from asynctier.tailers.kafka import KafkaTailer
from asynctier.tailers.options import TailerOptions
from tests.funcs.recording import (
    RecordingClient,
    RecordingConsumer,
    RecordingProducer,
    message,
    parts,
)

SETTINGS = Settings(kafka={"bootstrap.servers": "127.0.0.1:9", "log_level": "0"})
BINDING = Binding("orders", Source("kafka", "t"), "tests.funcs.ledger:record")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _tailer(consumer: RecordingConsumer, client: RecordingClient,
            options: TailerOptions, producer: RecordingProducer | None = None) -> KafkaTailer:
    return KafkaTailer(SETTINGS, BINDING, client, options,  # type: ignore[arg-type]
                       consumer_factory=lambda conf: consumer,
                       handoff=Handoff(SETTINGS, producer or RecordingProducer()))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["revoke", "lost"])
def test_records_of_a_partition_gone_inside_consume_are_not_run_and_others_kept(
        mode: str) -> None:
    consumer, client = RecordingConsumer(ready=[message(1, 1)]), RecordingClient()
    tailer = _tailer(consumer, client,
                     TailerOptions(batch_size=100, max_in_flight=2, linger_s=10.0,
                                   idle_poll_s=0.0))
    pipeline = tailer.open()
    consumer.assign(parts("t", 0, 1))
    pipeline.step()  # reads (1, 1)
    pipeline.step()  # sends it: one batch under way
    assert client.sent() == [(1, 1)]
    consumer.ready += [message(0, 5), message(0, 6)]
    pipeline.step()  # two records of partition 0 read, waiting (linger) to leave
    assert [(m.partition(), m.offset()) for m in pipeline.pending] == [(0, 5), (0, 6)]

    def partition_0_goes() -> None:  # served inside the next poll/consume
        if mode == "revoke":
            client.calls[0].ok()  # the revoke finishes the batch under way first
            consumer.revoke(parts("t", 0))
        else:
            consumer.lose(parts("t", 0))
        consumer.ready.append(message(1, 10))

    consumer.serve = partition_0_goes
    for _ in range(2):
        pipeline.step()
    assert consumer.serve is None  # the callback was served
    tailer.options.linger_s = 0.0  # the linger is over: what waits leaves now
    pipeline.step()
    sent = client.sent() + [(m.partition(), m.offset()) for m in pipeline.pending]
    assert (0, 5) not in sent and (0, 6) not in sent  # the partition's new owner runs them
    assert (1, 10) in sent  # what the consumer returned in the same call is not dropped
    assert tailer.source is not None and ("t", 0) not in tailer.source.owned


def test_stopping_with_an_unconfirmed_hand_off_commits_nothing_after_it() -> None:
    """A hand-off the broker refused, then a stop: the revoke at close() confirms an empty
    producer (the failed records were never produced again) and must still not commit."""
    consumer, client = RecordingConsumer(ready=[message(0, 7)]), RecordingClient()
    producer = RecordingProducer(refuse=1)
    tailer = _tailer(consumer, client, TailerOptions(handoff_retry_s=0.01, idle_poll_s=0.0),
                     producer)
    pipeline = tailer.open()
    consumer.assign(parts("t", 0))
    pipeline.step()  # read
    pipeline.step()  # sent
    client.calls[0].answer([wire.retry(0, "boom")])
    pipeline.step()  # answered: handed off (produced), not confirmed
    assert len(producer.produced) == 1 and [b.counts["retry"] for b in pipeline.handed] == [1]
    pipeline.stop.set()  # the stop arrives while the hand-off is being retried
    with pytest.raises(SchedulerUnavailable):
        pipeline.step()  # nothing else to do: confirm (refused), then the stop
    assert producer.confirms == 1
    consumer.revoke(parts("t", 0))  # what the revoke callback at close() does
    assert consumer.commits == []


def _delay_tailer(consumers: list[RecordingConsumer], client: RecordingClient | None = None,
                  ) -> DelayTailer:
    book = BindingBook(SETTINGS)
    book.update({BINDING.name: BINDING})
    return DelayTailer(SETTINGS, 1.0, book, client or RecordingClient(),  # type: ignore[arg-type]
                       DelayOptions(batch_size=10, idle_poll_s=0.1),
                       consumer_factory=lambda conf: consumers.pop(0),
                       handoff=Handoff(SETTINGS, RecordingProducer()))  # type: ignore[arg-type]


def _delayed(partition: int, offset: int) -> object:
    """A delay record of binding ``orders``, long due."""
    return message(partition, offset, topic=SETTINGS.names.delay_topic("1s"),
                   headers=[(n.H_BINDING, BINDING.name.encode())], timestamp_ms=1000)


def test_a_delay_tailer_releases_and_commits_only_partitions_it_still_owns() -> None:
    """A revoke served inside the second ``consume()`` of a read: the record already read
    from that partition is not released (its new owner releases it) and its offset is not
    committed (that would move the new owner's position)."""
    consumer, client = RecordingConsumer(), RecordingClient()
    tailer = _delay_tailer([consumer], client)
    pipeline = tailer.open()
    topic = tailer.topic
    consumer.subscribe([topic], on_assign=tailer.on_assign, on_revoke=tailer.on_revoke,
                       on_lost=tailer.on_lost)  # what the session does
    consumer.assign(parts(topic, 0, 1))
    consumer.ready = [_delayed(0, 7)]

    def revoke_0() -> None:  # served inside the second consume() of the read
        consumer.serve = revoke_0_now

    def revoke_0_now() -> None:
        consumer.revoke(parts(topic, 0))
        consumer.ready.append(_delayed(1, 3))

    consumer.serve = revoke_0
    pipeline.step()  # read: (0, 7), then the revoke, then (1, 3)
    assert [(m.partition(), m.offset()) for m in consumer.handed] == [(0, 7), (1, 3)]
    pipeline.step()  # sent
    assert client.sent() == [(1, 3)]  # released: only the partition still owned
    client.calls[0].ok()
    pipeline.step()  # answered: committed
    assert consumer.commits == [[(1, 4)]]


def test_a_late_callback_of_an_abandoned_consumer_leaves_the_new_session_alone() -> None:
    """A session whose consumer's ``close()`` was given up starts a new one; when the old
    ``close()`` returns at last it serves a revoke: that must not unassign or unpause the
    partitions of the new session's consumer."""
    old, new = RecordingConsumer(), RecordingConsumer()
    tailer = _delay_tailer([old, new])
    tailer.open()  # the session given up on
    tailer.open()  # the new session
    tailer.on_assign(new, parts(tailer.topic, 0, 1))
    tailer.pauses.pause(1, 10**15)
    tailer.on_revoke(old, parts(tailer.topic, 0, 1))
    tailer.on_lost(old, parts(tailer.topic, 0))
    topic = tailer.topic
    assert tailer.owned == {(topic, 0), (topic, 1)} and tailer.pauses.is_paused(1)
    tailer.on_revoke(new, parts(tailer.topic, 1))
    assert tailer.owned == {(topic, 0)} and not tailer.pauses.is_paused(1)

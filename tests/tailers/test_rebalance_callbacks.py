"""Every rebalance callback of the tailers does its own incremental (un)assign, and a
stopping tailer gives its partitions back (unsubscribe, then poll for the revoke) before
``close()``.

A callback that leaves it to confluent-kafka lets the library ask librdkafka for the
rebalance protocol first, holding the GIL; in the revoke that ``close()`` serves that
request can wait forever (librdkafka issue 4041), and the whole process froze with it (the
rolling-SIGTERM test, 1 run in 25 with 4 batches in flight). The callbacks are called here
with a consumer that records what it is asked, given to the tailers through their
``consumer_factory`` (no broker needed: the calls are ours)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from asynctier.delay_streams.handoff import Handoff
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.kafka import leave_group
from asynctier.tailers.delay import DelayTailer
from asynctier.tailers.kafka import KafkaTailer
from tests.funcs.recording import RecordingProducer

SETTINGS = Settings(kafka={"bootstrap.servers": "127.0.0.1:9", "log_level": "0"})


class Recorder:
    """The consumer methods a rebalance callback may call, recorded."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.refuse = refuse

    def _record(self, what: str, parts: list[TopicPartition]) -> None:
        self.calls.append((what, [tp.partition for tp in parts]))
        if self.refuse:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "refused here"))

    def incremental_assign(self, parts: list[TopicPartition]) -> None:
        self._record("assign", parts)

    def incremental_unassign(self, parts: list[TopicPartition]) -> None:
        self._record("unassign", parts)

    def resume(self, parts: list[TopicPartition]) -> None:
        pass

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        pass


def _parts(topic: str, *numbers: int) -> list[TopicPartition]:
    return [TopicPartition(topic, n) for n in numbers]


def _handoff() -> Handoff:
    return Handoff(SETTINGS, RecordingProducer())  # type: ignore[arg-type]


def _callbacks(which: int, consumer: Recorder) -> tuple[Any, str]:
    """The object whose rebalance callbacks a tailer's consumer is given, and its topic:
    the main tailer's or the delay tailer's partitions; ``consumer`` is its session's."""
    if which == 0:
        main = KafkaTailer(SETTINGS, Binding("b", Source("kafka", "src"),
                                             "tests.funcs.ledger:record"),
                           None,  # type: ignore[arg-type]
                           consumer_factory=lambda conf: consumer, handoff=_handoff())
        main.open()
        assert main.source is not None
        return main.source.partitions, "src"
    delay = DelayTailer(SETTINGS, 30.0, None, None,  # type: ignore[arg-type]
                        consumer_factory=lambda conf: consumer, handoff=_handoff())
    delay.open()
    return delay.partitions, delay.topic


@pytest.mark.parametrize("which", [0, 1], ids=["main tailer", "delay tailer"])
def test_each_callback_assigns_or_unassigns_what_it_is_given(which: int) -> None:
    consumer = Recorder()
    tailer, topic = _callbacks(which, consumer)
    tailer.on_assign(consumer, _parts(topic, 0, 1, 2))
    tailer.on_revoke(consumer, _parts(topic, 0))
    tailer.on_lost(consumer, _parts(topic, 1))
    tailer.on_revoke(consumer, [])  # the last revoke of a close() may be empty
    assert consumer.calls == [("assign", [0, 1, 2]), ("unassign", [0]), ("unassign", [1]),
                              ("unassign", [])]


def test_a_stale_consumers_callbacks_still_unassign_on_that_consumer() -> None:
    current = Recorder()  # this session's consumer; the callbacks come from another
    tailer, topic = _callbacks(1, current)
    old = Recorder()
    tailer.on_revoke(old, _parts(topic, 3))
    tailer.on_lost(old, _parts(topic, 4))
    assert old.calls == [("unassign", [3]), ("unassign", [4])]
    assert current.calls == []


@pytest.mark.parametrize("which", [0, 1], ids=["main tailer", "delay tailer"])
def test_a_refused_unassign_is_logged_and_the_callback_returns(
        which: int, caplog: pytest.LogCaptureFixture) -> None:
    consumer = Recorder(refuse=True)
    tailer, topic = _callbacks(which, consumer)
    with caplog.at_level(logging.WARNING):
        tailer.on_revoke(consumer, _parts(topic, 5))
    assert consumer.calls == [("unassign", [5])]
    assert "incremental unassign of 1 partition(s) refused: refused here" in caplog.text


class Leaving:
    """A consumer whose revoke comes on the ``polls_to_revoke``-th poll after unsubscribe()."""

    def __init__(self, owned: set[int], polls_to_revoke: int | None) -> None:
        self.owned = owned
        self.polls_to_revoke = polls_to_revoke
        self.calls: list[str] = []

    def unsubscribe(self) -> None:
        self.calls.append("unsubscribe")

    def poll(self, timeout: float) -> None:
        assert self.calls and self.calls[0] == "unsubscribe", "polled before unsubscribe()"
        self.calls.append("poll")
        if self.polls_to_revoke is not None and self.calls.count("poll") >= self.polls_to_revoke:
            self.owned.clear()  # what the tailer's revoke callback does


def test_leaving_the_group_unsubscribes_and_polls_until_the_revoke_is_served() -> None:
    owned = {0, 1}
    consumer = Leaving(owned, polls_to_revoke=3)
    leave_group(consumer, lambda: bool(owned), "test tailer")
    assert consumer.calls == ["unsubscribe", "poll", "poll", "poll"]
    assert not owned


def test_leaving_gives_up_after_its_timeout_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    owned = {0}
    consumer = Leaving(owned, polls_to_revoke=None)
    with caplog.at_level(logging.WARNING):
        leave_group(consumer, lambda: bool(owned), "test tailer", timeout_s=0.3)
    assert consumer.calls[0] == "unsubscribe" and consumer.calls.count("poll") >= 1
    assert "did not come within 0.3s" in caplog.text


def test_a_consumer_that_owns_nothing_only_unsubscribes() -> None:
    consumer = Leaving(set(), polls_to_revoke=1)
    leave_group(consumer, lambda: False, "test tailer")
    assert consumer.calls == ["unsubscribe"]

"""The tailer loop when a rebalance callback runs inside ``consume()``, and when it stops
with an unconfirmed hand-off (pure logic: the consumer is a stand-in that serves the
callback the way librdkafka does, from inside the call). The records of a partition revoked
there are not run by this tailer (its new owner runs them), and the records ``consume()``
returned are not dropped when a partition is lost; a stop during a refused hand-off commits
nothing. The real rebalances and hand-offs are exercised by tests/faults."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from typing import Any

import pytest

from asynctier.tailers.kafka import KafkaTailer, TailerOptions, _Batch


class _Msg:
    def __init__(self, partition: int, offset: int) -> None:
        self.p, self.o = partition, offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def error(self) -> None:
        return None


class _TP:
    def __init__(self, partition: int) -> None:
        self.topic, self.partition = "t", partition


class _Call:
    def __init__(self) -> None:
        self.future: Future[bytes] = Future()


def _tailer(mode: str) -> tuple[KafkaTailer, Any, list[list[tuple[int, int]]]]:
    tailer = KafkaTailer.__new__(KafkaTailer)
    tailer.options = TailerOptions(batch_size=100, max_in_flight=2, linger_s=10.0)
    tailer._in_flight, tailer._answered, tailer._handed = deque(), [], []
    tailer._committed, tailer.stats = {}, Counter()
    tailer._owned = {("t", 0), ("t", 1)}
    tailer._in_revoke = tailer._commit_sync = False
    tailer._stop = threading.Event()
    tailer.binding = type("B", (), {"name": "orders", "topic": "t"})()
    submitted: list[list[tuple[int, int]]] = []

    def submit(messages: list[_Msg]) -> None:
        submitted.append([(m.p, m.o) for m in messages])

    tailer._submit = submit  # type: ignore[method-assign]
    tailer._drain = lambda partitions=None: tailer._in_flight.clear()  # type: ignore[method-assign]

    class Consumer:
        calls = 0

        def incremental_unassign(self, partitions: Any) -> None:
            pass

        def consume(self, n: int, wait: float) -> list[_Msg]:
            self.calls += 1
            if self.calls == 1:  # partition 0 goes away while consume() runs
                callback = tailer._on_revoke if mode == "revoke" else tailer._on_lost
                callback(self, [_TP(0)])  # type: ignore[arg-type,list-item]
                return [_Msg(1, 10)]
            return [_Msg(1, 11)]

        def poll(self, timeout: float) -> None:
            return None

    # one batch under way; two records of partition 0 read and waiting to leave
    tailer._in_flight.append(_Batch([_Msg(1, 1)], _Call(), {("t", 1): 1}))  # type: ignore[arg-type]
    tailer._next = [_Msg(0, 5), _Msg(0, 6)]
    tailer._next_since = time.monotonic()
    return tailer, Consumer(), submitted


@pytest.mark.parametrize("mode", ["revoke", "lost"])
def test_records_of_a_partition_gone_inside_consume_are_not_run_and_others_kept(
        mode: str) -> None:
    logging.disable(logging.CRITICAL)
    try:
        tailer, consumer, submitted = _tailer(mode)
        for _ in range(3):
            tailer._step(consumer)
        tailer._next_since = 0.0  # the linger is over: what waits leaves now
        tailer._step(consumer)
    finally:
        logging.disable(logging.NOTSET)
    sent = [rec for batch in submitted for rec in batch] + [
        (m.p, m.o) for m in tailer._next]
    assert (0, 5) not in sent and (0, 6) not in sent  # the partition's new owner runs them
    assert (1, 10) in sent  # what consume() returned in the same call is not dropped
    assert ("t", 0) not in tailer._owned


def test_stopping_with_an_unconfirmed_hand_off_commits_nothing_after_it() -> None:
    """A hand-off the broker refused, then a stop: the revoke at close() confirms an empty
    producer (the failed records were never produced again) and must still not commit."""
    from asynctier.platform.errors import HandoffError, SchedulerUnavailable

    class Handoff:
        confirms = 0

        def confirm(self) -> None:
            self.confirms += 1
            if self.confirms == 1:
                raise HandoffError("1 delivery failure(s): Broker: Message size too large")

    class Consumer:
        commits: list[Any] = []

        def commit(self, offsets: Any, asynchronous: bool) -> None:
            self.commits.append(offsets)

        def assignment(self) -> list[Any]:
            return []

    tailer = KafkaTailer.__new__(KafkaTailer)
    tailer.options = TailerOptions(handoff_retry_s=0.01)
    tailer.binding = type("B", (), {"name": "orders", "topic": "t", "tenant": "x"})()
    tailer.handoff = Handoff()  # type: ignore[assignment]
    consumer = Consumer()
    tailer._consumer = consumer  # type: ignore[assignment]
    tailer._in_flight, tailer._committed = deque(), {}
    tailer._answered = []
    tailer._owned = {("t", 0)}
    tailer._in_revoke = tailer._commit_sync = False
    tailer._no_more_commits = False
    tailer.stats = Counter()
    tailer._fault = type("F", (), {"reached": lambda self, where: None})()
    tailer._stop = threading.Event()
    tailer._stop.set()  # the stop arrives while the hand-off is being retried
    failed = _Batch([_Msg(0, 7)], _Call(), {("t", 0): 7})  # type: ignore[arg-type]
    failed.counts = Counter({"retry": 1})
    tailer._handed = [failed]
    logging.disable(logging.CRITICAL)
    try:
        with pytest.raises(SchedulerUnavailable):
            tailer._settle()
        tailer._drain({("t", 0)})  # what the revoke callback at close() does
    finally:
        logging.disable(logging.NOTSET)
    assert consumer.commits == []


class _DelayMsg(_Msg):
    def timestamp(self) -> tuple[int, int]:
        return (1, 1000)  # long due

    def headers(self) -> None:
        return None


def test_a_delay_tailer_releases_and_commits_only_partitions_it_still_owns() -> None:
    """A revoke served inside the second ``consume()`` of a poll: the record already read
    from that partition is not released (its new owner releases it) and its offset is not
    committed (that would move the new owner's position)."""
    from asynctier.delay_streams.pauses import PauseBook
    from asynctier.tailers.delay import DelayOptions, DelayTailer

    tailer = DelayTailer.__new__(DelayTailer)
    tailer.topic, tailer.interval, tailer.interval_ms = "t", "1s", 1000
    tailer.options = DelayOptions(batch_size=10)
    tailer.pauses = PauseBook()
    tailer.assigned = threading.Event()
    tailer._owned, tailer._consumer = set(), None

    class Consumer:
        commits: list[list[tuple[int, int]]] = []
        calls = 0

        def incremental_assign(self, partitions: Any) -> None:
            pass

        def incremental_unassign(self, partitions: Any) -> None:
            pass

        def resume(self, partitions: Any) -> None:
            pass

        def consume(self, n: int, wait: float) -> list[_Msg]:
            self.calls += 1
            if self.calls == 1:
                return [_DelayMsg(0, 7)]
            tailer._on_revoke(self, [_TP(0)])  # type: ignore[arg-type,list-item]
            return [_DelayMsg(1, 3)]

        def commit(self, offsets: Any, asynchronous: bool) -> None:
            self.commits.append([(tp.partition, tp.offset) for tp in offsets])

    consumer = Consumer()
    tailer._on_assign(consumer, [_TP(0), _TP(1)])  # type: ignore[arg-type,list-item]
    logging.disable(logging.CRITICAL)
    try:
        read = tailer._poll(consumer, 0.1)  # type: ignore[arg-type]
        released = tailer._sort(consumer, read)  # type: ignore[arg-type]
        tailer._commit(consumer, read)  # type: ignore[arg-type]
    finally:
        logging.disable(logging.NOTSET)
    assert [(m.partition(), m.offset()) for m in read] == [(0, 7), (1, 3)]
    assert [(m.partition(), m.offset()) for m in released] == [(1, 3)]
    assert consumer.commits == [[(1, 4)]]


def test_a_late_callback_of_an_abandoned_consumer_leaves_the_new_session_alone() -> None:
    """A session whose consumer's ``close()`` was given up starts a new one; when the old
    ``close()`` returns at last it serves a revoke: that must not unassign or unpause the
    partitions of the new session's consumer."""
    from asynctier.delay_streams.pauses import PauseBook
    from asynctier.tailers.delay import DelayTailer

    tailer = DelayTailer.__new__(DelayTailer)
    tailer.interval = "1s"
    tailer.pauses = PauseBook()
    tailer.assigned = threading.Event()

    class Consumer:
        def incremental_assign(self, partitions: Any) -> None:
            pass

        def incremental_unassign(self, partitions: Any) -> None:
            pass

        def resume(self, partitions: Any) -> None:
            pass

    old, new = Consumer(), Consumer()
    tailer._owned, tailer._consumer = set(), new  # type: ignore[assignment]
    tailer._on_assign(new, [_TP(0), _TP(1)])  # type: ignore[arg-type,list-item]
    tailer.pauses.pause(1, 10**15)
    logging.disable(logging.CRITICAL)
    try:
        tailer._on_revoke(old, [_TP(0), _TP(1)])  # type: ignore[arg-type,list-item]
        tailer._on_lost(old, [_TP(0)])  # type: ignore[arg-type,list-item]
    finally:
        logging.disable(logging.NOTSET)
    assert tailer._owned == {0, 1} and tailer.pauses.is_paused(1)
    tailer._on_revoke(new, [_TP(1)])  # type: ignore[arg-type,list-item]
    assert tailer._owned == {0} and not tailer.pauses.is_paused(1)

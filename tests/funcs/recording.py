"""Recording stand-ins for the clients a tailer is given (a Kafka consumer, a producer for
its Handoff, a scheduler client): unit tests build tailers through their constructors with
these, and read what the tailer asked of each. The real clients are exercised by the
tests that run on the real Kafka and scheduler."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Message, TopicPartition

from asynctier.platform import names as n
from asynctier.platform import wire
from asynctier.platform.errors import HandoffError
from tests.helpers import headers_by_name

Log = list[tuple[Any, ...]]


def message(partition: int, offset: int, topic: str = "t", value: bytes | None = b"{}",
            headers: list[tuple[str, str | bytes | None]] | None = None,
            timestamp_ms: int = 1_700_000_000_000) -> Message:
    """A consumed record (a real confluent-kafka Message, made by hand)."""
    return Message(topic=topic, partition=partition, offset=offset, key=None, value=value,
                   headers=headers, timestamp=(1, timestamp_ms))


def parts(topic: str, *numbers: int) -> list[TopicPartition]:
    """TopicPartitions of ``topic``."""
    return [TopicPartition(topic, number) for number in numbers]


class RecordingConsumer:
    """A consumer that hands out ``ready`` and records commits, (un)assigns and pauses in
    ``log``. ``subscribe`` keeps the rebalance callbacks: :meth:`assign`, :meth:`revoke`
    and :meth:`lose` serve them the way librdkafka does, from the consumer's side.
    ``serve`` (set by a test) runs inside the next ``poll``/``consume`` call, once."""

    def __init__(self, log: Log | None = None, ready: list[Any] | None = None) -> None:
        self.log: Log = log if log is not None else []
        self.ready: list[Any] = ready if ready is not None else []
        self.handed: list[Any] = []  # every record poll() and consume() returned
        self.assigned: list[TopicPartition] = []
        self.commits: list[list[tuple[int, int]]] = []
        self.callbacks: dict[str, Callable[..., None]] = {}
        self.serve: Callable[[], None] | None = None
        self.on_pause: Callable[[], None] = self._unanswered

    @staticmethod
    def _unanswered() -> None:
        raise AssertionError("the tailer waits for an answer (it paused its partitions) "
                             "that this test never gives")

    def _serve(self) -> None:
        serve, self.serve = self.serve, None
        if serve is not None:
            serve()

    def subscribe(self, topics: list[str], **callbacks: Callable[..., None]) -> None:
        self.log.append(("subscribe", topics))
        self.callbacks = callbacks

    def assign(self, partitions: list[TopicPartition]) -> None:
        """The group gave this consumer ``partitions``."""
        self.callbacks["on_assign"](self, partitions)

    def revoke(self, partitions: list[TopicPartition]) -> None:
        """The group takes ``partitions`` back."""
        self.callbacks["on_revoke"](self, partitions)

    def lose(self, partitions: list[TopicPartition]) -> None:
        """The group gave ``partitions`` to another consumer already."""
        self.callbacks["on_lost"](self, partitions)

    def poll(self, timeout: float) -> Any:
        self._serve()
        if not self.ready:
            return None
        first = self.ready.pop(0)
        self.handed.append(first)
        return first

    def consume(self, num: int, timeout: float) -> list[Any]:
        self._serve()
        got, self.ready[:num] = self.ready[:num], []
        self.handed += got
        return got

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        done = [(tp.partition, tp.offset) for tp in offsets]
        self.commits.append(done)
        self.log.append(("commit", [offset for _, offset in done]))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += partitions
        self.log.append(("assign", [tp.partition for tp in partitions]))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned = [tp for tp in self.assigned if (tp.topic, tp.partition) not in gone]
        self.log.append(("unassign", [tp.partition for tp in partitions]))

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.log.append(("pause", [tp.partition for tp in partitions]))
        self.on_pause()

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass

    def seek(self, partition: TopicPartition) -> None:
        pass

    def close(self) -> None:
        self.log.append(("close",))


class RecordingProducer:
    """The producer of a :class:`~asynctier.delay_streams.handoff.Handoff`: records what is
    produced (``("produce", topic, origin)`` in ``log``) and each ``confirm``; the first
    ``refuse`` confirms raise HandoffError (a delivery the broker refused)."""

    def __init__(self, log: Log | None = None, refuse: int = 0, partitions: int = 1) -> None:
        self.log: Log = log if log is not None else []
        self.refuse = refuse
        self.partitions = partitions
        self.produced: list[tuple[str, bytes | None, list[tuple[str, bytes | None]]]] = []
        self.confirms = 0

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[tuple[str, bytes | None]] | None = None,
                timestamp_ms: int = 0, partition: int = -1) -> None:
        self.produced.append((topic, value, list(headers or [])))
        origin = headers_by_name(headers or ()).get(n.H_ORIGIN)
        self.log.append(("produce", topic, origin.decode() if origin else None))

    def client_produce(self, topic: str, value: bytes | None, key: bytes | None,
                       partition: int, callback: Any, on_delivery: Any, timestamp: int,
                       headers: list[tuple[str, bytes | None]] | None) -> None:
        self.produce(topic, value, key, headers, timestamp, partition)

    def partition_count(self, topic: str, timeout_s: float = 2.0) -> int | None:
        return self.partitions

    def poll(self, timeout_s: float = 0.0) -> None:
        pass

    def confirm(self, timeout_s: float = 30.0) -> None:
        self.confirms += 1
        self.log.append(("confirm",))
        if self.confirms <= self.refuse:
            raise HandoffError("1 delivery failure(s): Broker: Message size too large")

    def close(self, timeout_s: float = 10.0) -> None:
        pass


class Call:
    """A submit call whose answer the test gives (``answer``)."""

    def __init__(self, items: list[wire.Item]) -> None:
        self.items = items
        self.future: Future[bytes] = Future()
        self.outcomes: list[wire.Outcome] = []

    def answer(self, outcomes: list[wire.Outcome]) -> None:
        self.outcomes = outcomes
        self.future.set_result(b"")

    def ok(self) -> None:
        """Every item ran."""
        self.answer([wire.ok(i) for i in range(len(self.items))])

    def result(self, stop: threading.Event | None = None) -> list[wire.Outcome]:
        self.future.result()
        return self.outcomes


class RecordingClient:
    """A scheduler client whose calls are answered by the test; each submit is logged as
    ``("submit", [offsets])`` (the offsets of the items' ``source_ref``)."""

    def __init__(self, log: Log | None = None) -> None:
        self.log: Log = log if log is not None else []
        self.calls: list[Call] = []

    def submit_encoded(self, payload: bytes, count: int, spread: str | None = None) -> Call:
        items = wire.decode_items(payload)
        assert len(items) == count
        self.log.append(("submit", [int(i["source_ref"].rsplit("/", 1)[1]) for i in items]))
        call = Call(items)
        self.calls.append(call)
        return call

    def sent(self) -> list[tuple[int, int]]:
        """(partition, offset) of every item submitted so far."""
        found = []
        for call in self.calls:
            for item in call.items:
                _, partition, offset = item["source_ref"].rsplit("/", 2)
                found.append((int(partition), int(offset)))
        return found

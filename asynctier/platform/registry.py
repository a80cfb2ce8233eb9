"""The binding registry: the compacted topic ``<prefix>.bindings``, keyed by name.

Every process reads it whole at start (:meth:`BindingRegistry.load`) and follows it live
(:class:`RegistryFollower`): a new binding is announced, a tombstone removes one. Writing
(:meth:`BindingRegistry.put`, :meth:`BindingRegistry.delete`) waits for the broker's
confirmation.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, BindingError
from asynctier.platform.kafka import (
    ConfirmingProducer,
    admin,
    ensure_topics,
    topic_replication,
)
from asynctier.platform.supervise import Supervisor

log = logging.getLogger(__name__)

OnChange = Callable[[dict[str, Binding]], None]


class BindingRegistry:
    """Reads and writes the bindings topic of one prefix."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.names.bindings_topic

    def ensure_topic(self) -> None:
        """Create the compacted bindings topic when it is missing."""
        ensure_topics(admin(self.settings), {
            self.topic: (1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}),
        }, replication=topic_replication(self.settings))

    def put(self, binding: Binding) -> None:
        """Store a (validated) binding; returns once the broker confirmed it."""
        binding.validate()
        self.ensure_topic()
        producer = ConfirmingProducer(self.settings)
        producer.produce(self.topic, binding.encode(), binding.name.encode())
        producer.confirm()

    def delete(self, name: str) -> None:
        """Remove a binding with a tombstone; BindingError when there is none by that name."""
        if name not in self.load():
            raise BindingError(f"name: there is no binding named {name!r} "
                               "(see `asynctier bindings`)")
        producer = ConfirmingProducer(self.settings)
        producer.produce(self.topic, None, name.encode())
        producer.confirm()

    def load(self, timeout_s: float = 15.0) -> dict[str, Binding]:
        """Every binding, read from the beginning of the topic up to its end."""
        self.ensure_topic()
        consumer = _reader(self.settings)
        try:
            state: dict[str, Binding] = {}
            _read_to_end(consumer, self.topic, state, timeout_s)
            return state
        finally:
            consumer.close()


def _reader(settings: Settings) -> Consumer:
    return Consumer(settings.kafka_config(**{
        "group.id": f"{settings.prefix}.registry-reader.{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    }))


def _apply(state: dict[str, Binding], key: bytes | None, value: bytes | None,
           where: str) -> bool:
    """Apply one record to ``state``; True when it changed."""
    if key is None:
        return False
    name = key.decode("utf-8", "replace")
    if value is None:
        return state.pop(name, None) is not None
    try:
        binding = Binding.decode(value)
    except Exception as exc:  # a bad record must not stop a process
        log.error("binding record %s (key %r) does not decode and is ignored: %s",
                  where, name, exc)
        return False
    if state.get(name) == binding:
        return False
    state[name] = binding
    return True


def _read_to_end(consumer: Consumer, topic: str, state: dict[str, Binding],
                 timeout_s: float) -> None:
    md = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
    parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions]
    ends = {}
    for tp in parts:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        if high > low:
            ends[tp.partition] = high
    consumer.assign(parts)
    deadline = time.monotonic() + timeout_s
    while ends:
        if time.monotonic() > deadline:
            raise AsynctierError(f"could not read the bindings topic {topic} to its end "
                                 f"within {timeout_s:g}s; is the broker healthy?")
        for msg in consumer.consume(500, 0.5):
            err = msg.error()
            part = msg.partition() or 0
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ends.pop(part, None)
                continue
            _apply(state, msg.key(), msg.value(), f"at offset {msg.offset()}")
            if (msg.offset() or 0) + 1 >= ends.get(part, 0):
                ends.pop(part, None)


class RegistryFollower:
    """Follows the bindings topic in a thread and calls ``on_change(bindings)`` on changes.

    :meth:`start` returns after the topic has been read whole once (the first
    ``on_change`` call has been made). The thread runs under a supervisor: a consumer that
    fails is replaced by a new one, which reads the topic whole again (after a bounded
    backoff), so a process never goes on with bindings it stopped hearing about.
    """

    def __init__(self, settings: Settings, on_change: OnChange) -> None:
        self.settings = settings
        self.registry = BindingRegistry(settings)
        self.on_change = on_change
        self.bindings: dict[str, Binding] = {}
        self._stop = threading.Event()
        self._supervisor: Supervisor | None = None
        self._consumer: Consumer | None = None

    def start(self) -> None:
        """Read everything once, report it, then follow changes in the background."""
        self.registry.ensure_topic()
        self._consumer = self._read_whole()
        self._supervisor = Supervisor(
            "registry-follower", self._follow, self._stop,
            what="the bindings registry follower", policy=self.settings.restarts,
            hint=f"Binding changes are not seen meanwhile (the bindings known go on); "
                 f"check the broker and the topic {self.registry.topic}.",
            on_restart=metrics.count_task_restart).start()

    def _read_whole(self) -> Consumer:
        """A new reader that has read the topic to its end; the bindings reported."""
        consumer = _reader(self.settings)
        try:
            state: dict[str, Binding] = {}
            _read_to_end(consumer, self.registry.topic, state, 30.0)
        except BaseException:
            consumer.close()
            raise
        self.bindings = state
        self._notify()
        return consumer

    def _notify(self) -> None:
        try:
            self.on_change(dict(self.bindings))
        except Exception:
            log.exception("a binding change could not be applied; will apply the next one")

    def _follow(self, stop: threading.Event) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:  # a restart: read it all again
            consumer = self._read_whole()
        try:
            while not stop.is_set():
                changed = False
                for msg in consumer.consume(100, 0.5):
                    err = msg.error()
                    if err is None:
                        changed |= _apply(self.bindings, msg.key(), msg.value(),
                                          f"at offset {msg.offset()}")
                    elif err.fatal():
                        raise KafkaException(err)
                if changed:
                    self._notify()
        finally:
            consumer.close()

    def stop(self) -> None:
        """Stop following."""
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(5)

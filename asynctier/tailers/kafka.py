"""The Kafka source: one consumer group per binding, at-least-once checkpoints.

The pipeline (:mod:`asynctier.tailers.pipeline`) does the batching, the order and the
retries; this module is what is Kafka's own: the consumer (no decoding here: the scheduler
decodes), the hand-off of non-ok outcomes to delay and dead-letter topics
(:class:`~asynctier.delay_streams.handoff.Handoff`) and commits per partition highest + 1.
The partitions it owns and the rebalance callbacks are :mod:`asynctier.tailers.partitions`';
per-key order (:mod:`asynctier.tailers.key_order`) and moved records
(:mod:`asynctier.tailers.moved`) are strategies wrapped around this source.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from asynctier.delay_streams.handoff import Handoff, where
from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.config import Settings
from asynctier.platform.errors import SchedulerUnavailable
from asynctier.platform.kafka import (
    close_consumer,
    commit_past,
    leave_group,
    tailer_consumer_config,
)
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.supervise import Supervisor
from asynctier.tailers.key_order import by_ordering
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.partitions import Partitions, sort_out
from asynctier.tailers.pipeline import Hook, Pipeline, no_hook
from asynctier.tailers.sent_marks import SentMarks
from asynctier.tailers.source import TP, Batch, Offsets, OffsetSource, Prepared, high_marks

log = logging.getLogger(__name__)

COMPONENT = "tailer"

ConsumerFactory = Callable[[dict[str, Any]], Any]

# Read-ahead is bounded so that a tailer's memory does not grow with the backlog behind
# it: some 10,000 records of 100 bytes queued, a fraction of a second of work; a larger
# record still comes through whole.
#: How long the broker may hold a fetch for more records (low latency when they trickle).
FETCH_WAIT_MAX_MS = 50
#: Records the client queues ahead of the tailer, in KiB.
QUEUED_MAX_KBYTES = 2048
#: The most one fetch brings.
FETCH_MAX_BYTES = 1 << 20
#: A call is waited for in slices of at most this, polling the consumer between them ...
WAIT_SLICE_S = 1.0
#: How long a partition's log end is waited for when it has no sent mark.
MARK_END_TIMEOUT_S = 5.0
#: ... and of at most max.poll.interval.ms over this: several polls per interval, so a
#: late one does not push the consumer out of its group.
POLLS_PER_INTERVAL = 4
#: How long a stopping tailer tries again a final commit refused because the group is
#: rebalancing (inside a revoke it is not tried again: no polling there).
FINAL_COMMIT_S = 10.0
#: The poll that serves that rebalance between two tries.
REBALANCE_POLL_S = 0.2
#: How long a stopping tailer waits for the loops beside it (the parked-key runner).
BESIDE_JOIN_S = 60.0


def consumer_config(settings: Settings, group: str, options: TailerOptions) -> dict[str, Any]:
    """The main tailer's consumer (see :func:`tailer_consumer_config`)."""
    return tailer_consumer_config(settings, group,
                                  session_timeout_ms=options.session_timeout_ms,
                                  max_poll_interval_ms=options.max_poll_interval_ms,
                                  fetch_wait_max_ms=FETCH_WAIT_MAX_MS,
                                  queued_max_kbytes=QUEUED_MAX_KBYTES,
                                  fetch_max_bytes=FETCH_MAX_BYTES)


#: Commit errors that mean "the group is rebalancing": worth a retry once it is through.
_REBALANCING = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                KafkaError._STATE)


@dataclass(frozen=True)
class Sent:
    """What a Kafka batch keeps for its hand-off: each sent record's origin
    (``topic/partition/offset``) and the call's size."""

    origins: list[str]
    size: int


class KafkaSource:
    """A binding's topic as an :class:`~asynctier.tailers.source.OffsetSource`."""

    def __init__(self, settings: Settings, binding: Binding, consumer: Any, handoff: Handoff,
                 options: TailerOptions, marks: SentMarks | None = None) -> None:
        self.settings = settings
        self.marks = marks  # which records are fresh (None: none is)
        self.binding = binding
        self.consumer = consumer
        self.handoff = handoff
        self.options = options
        self.what = f"binding {binding.name}"
        self.topic = binding.source.topic
        self.partitions = Partitions(self.what)
        self.owned = self.partitions.owned  # only these are run and committed
        self.committed: dict[TP, int] = {}
        self.stats: Counter[str] = Counter()
        self.held: set[TP] = set()  # paused by a strategy (see hold): kept paused
        self.early: list[Any] = []  # polled while waiting for a call: read first
        self.partitions.listen(assigned=self._assigned, gone=self._gone)

    # -- reading --------------------------------------------------------------------------

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """What was polled while waiting for a call, then ``poll`` for the first record,
        then what the client holds already."""
        early, self.early = self.early, []
        if early:
            left = max_records - len(early)
            return early + list(self.consumer.consume(left, 0)) if left > 0 else early
        if wait_s <= 0:
            return list(self.consumer.consume(max_records, 0))
        first = self.consumer.poll(wait_s)
        if first is None:
            return []
        return [first, *self.consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]

    def prepare(self, records: list[Any]) -> Prepared[Sent]:
        """One call of the records of owned partitions (consume errors are logged)."""
        name = self.binding.name
        owned, _ = sort_out(records, self.owned, self.what, self.topic)
        origins: list[str] = []
        call = CallBuilder()
        add = call.add
        starts = self._fresh_starts(owned)
        for at, msg in enumerate(owned):
            origin = where(msg)
            start = starts.get(msg.partition()) if starts else None
            if not add(name, msg.value(), msg.key(), msg.headers(), 1, origin,
                       msg.timestamp()[1], fresh=start is not None and msg.offset() >= start):
                good, rest = owned[:at], owned[at:]  # the call is full: the next one
                break
            origins.append(origin)
        else:
            good, rest = owned, []
        return Prepared(good, call.encode() if good else None, Sent(origins, call.size),
                        high_marks(good), rest)

    def _fresh_starts(self, records: list[Any]) -> dict[int, int]:
        """Per partition of ``records`` (all of this topic), the offset from which they
        are fresh (:class:`SentMarks`), its mark raised past them first."""
        if self.marks is None or not records:
            return {}
        last: dict[int, int] = {}
        for msg in records:
            partition, offset = msg.partition(), msg.offset()
            if offset > last.get(partition, -1):
                last[partition] = offset
        starts = {}
        for partition, offset in last.items():
            start = self.marks.fresh_start((self.topic, partition), offset)
            if start is not None:
                starts[partition] = start
        return starts

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions assigned: take their sent marks (:meth:`SentMarks.take`)."""
        if self.marks is not None:
            self.marks.take([(tp.topic, tp.partition) for tp in partitions],
                            lambda tp: int(consumer.get_watermark_offsets(
                                TopicPartition(*tp), timeout=MARK_END_TIMEOUT_S,
                                cached=False)[1]))

    def wait(self, batch: Batch[Any], superseded: Callable[[], bool]) -> bool:
        """Wait for the answer while polling the consumer (its partitions paused).

        A call longer than ``max.poll.interval.ms`` (slow functions, a full queue) would
        otherwise push this consumer out of its group, and the batch would be read, run
        and never committed again and again. A record polled meanwhile (of a partition
        assigned meanwhile) is read first next time.
        """
        assert batch.call is not None
        answered = threading.Event()
        batch.call.future.add_done_callback(lambda _: answered.set())
        slice_s = min(WAIT_SLICE_S,
                      self.options.max_poll_interval_ms / 1000 / POLLS_PER_INTERVAL)
        paused: list[TopicPartition] = []
        consumer = self.consumer
        try:
            while not answered.wait(slice_s):
                if not paused:
                    paused = [tp for tp in consumer.assignment()
                              if (tp.topic, tp.partition) not in self.held]
                    consumer.pause(paused)  # resumed below, from the same position
                msg = consumer.poll(0)  # keeps the membership; serves rebalances
                if msg is not None:
                    self.early.append(msg)
                if superseded():
                    return False
        finally:
            if paused:
                with contextlib.suppress(KafkaException):
                    consumer.resume(paused)
        return True

    def hold(self, pause: Sequence[TP], resume: Sequence[TP]) -> None:
        """Pause ``pause``, resume ``resume`` (from the position reached: nothing is
        skipped); a partition held stays paused through :meth:`wait`."""
        self.held.update(pause)
        self.held.difference_update(resume)
        for tps, act, verb in ((pause, self.consumer.pause, "pause"),
                               (resume, self.consumer.resume, "resume")):
            if tps:
                try:
                    act([TopicPartition(t, p) for t, p in tps])
                except KafkaException as exc:
                    log.warning("%s: could not %s %d partition(s) (%s)", self.what, verb,
                                len(tps), exc.args[0].str())

    # -- resolving and committing ---------------------------------------------------------

    def hand_off(self, batch: Batch[Sent]) -> Counter[str]:
        """Delay or dead-letter records for every non-ok outcome."""
        sent = batch.extra
        return self.handoff.resolve_messages(self.binding, batch.records, batch.outcomes,
                                             sent.origins, sent.size)

    def confirm(self) -> None:
        """Every delay and dead-letter record so far delivered, or HandoffError."""
        self.handoff.confirm()

    def checkpoint(self, batch: Batch[Any], sync: bool) -> None:
        """Commit past the batch's offsets (see :meth:`commit`)."""
        self.commit(batch.mark, sync)

    def commit(self, mark: Offsets, sync: bool) -> None:
        """Commit past ``mark``'s highest offset of each partition still owned:
        asynchronously in the loop, synchronously when draining (revoke, stop)."""
        owned = self.owned
        for done in commit_past(self.consumer, mark, lambda t, p: (t, p) in owned, sync,
                                self.what):
            self.committed[(done.topic, done.partition)] = done.offset

    def counted(self, batch: Batch[Any]) -> None:
        """Batch and outcome metrics."""
        metrics.count_batch(COMPONENT, self.binding.name)
        metrics.record_outcomes(self.binding.name, self.binding.tenant, batch.counts)
        self.stats.update(batch.counts)

    def checkpoint_final(self, scope: set[TP] | None) -> None:
        """Commit synchronously where this tailer stands on ``scope`` (all when None): an
        asynchronous commit still on its way must land before another consumer takes a
        partition over."""
        mine = [TopicPartition(t, p, o) for (t, p), o in self.committed.items()
                if (scope is None or (t, p) in scope) and (t, p) in self.owned]
        if scope is not None:
            for tp in scope:
                self.committed.pop(tp, None)
        if not mine:
            return
        # When stopping (not inside a rebalance callback), a commit refused because the
        # group is rebalancing is tried again once the rebalance is through, for the
        # partitions this tailer still owns; otherwise they would be read again.
        deadline = time.monotonic() + (0.0 if self.partitions.in_revoke else FINAL_COMMIT_S)
        while True:
            try:
                self.consumer.commit(offsets=mine, asynchronous=False)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() not in _REBALANCING or time.monotonic() >= deadline:
                    log.warning("binding %s: final commit failed (%s); the records after "
                                "the last commit that landed will be read again",
                                self.binding.name, error.str())
                    return
            self.consumer.poll(REBALANCE_POLL_S)  # serves the rebalance; a record it
            owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            mine = [tp for tp in mine if (tp.topic, tp.partition) in owned]  # returns is
            if not mine:  # not run
                return

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The consumer's commit callback: a failed asynchronous commit is logged."""
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            log.warning("binding %s: a commit failed (%s); the next one covers it, or the "
                        "records are read again", self.binding.name, err.str())

    # -- partitions gone ------------------------------------------------------------------

    def on_gone(self, forget: Callable[[set[TP]], None]) -> None:
        """Call ``forget`` with the partitions revoked or lost."""
        self.partitions.listen(gone=forget)

    def _gone(self, gone: set[TP]) -> None:
        """Partitions revoked or lost: nothing of them is committed or read first any more;
        those held are resumed (a partition assigned again is read from its commit)."""
        for tp in gone:
            self.committed.pop(tp, None)
        if self.marks is not None:
            self.marks.forget(gone)
        self.early = [m for m in self.early if (m.topic(), m.partition()) not in gone]
        held = [TopicPartition(t, p) for t, p in gone & self.held]
        self.held -= gone
        if held:
            with contextlib.suppress(KafkaException):
                self.consumer.resume(held)

    def beside(self, stop: threading.Event) -> list[Supervisor]:
        """No loop beside a plain topic's pipeline."""
        return []


class KafkaTailer:
    """Tails one binding's topic in the group ``<prefix>.<binding>``.

    The Kafka consumer is made by ``consumer_factory`` (its config in) and the hand-off by
    ``handoff`` (default: a :class:`Handoff` with its own producer), so tests can pass
    recording stand-ins; ``hook`` is called at the pipeline's named points (fault tests).
    """

    def __init__(self, settings: Settings, binding: Binding, client: SchedulerClient,
                 options: TailerOptions | None = None, *,
                 consumer_factory: ConsumerFactory = Consumer,
                 handoff: Handoff | None = None, hook: Hook = no_hook) -> None:
        self.settings = settings
        self.binding = binding
        self.client = client
        self.options = options or TailerOptions()
        self.group = settings.names.group(binding.name)
        self.hook = hook
        self.handoff = handoff or Handoff(settings)
        self._consumer_factory = consumer_factory
        self.source: KafkaSource | None = None  # the topic
        self.strategy: OffsetSource[Any] | None = None  # what the pipeline runs
        self.pipeline: Pipeline[Any] | None = None

    @property
    def stats(self) -> Counter[str]:
        """What became of the records so far (ok, retry, dead_letter)."""
        return self.source.stats if self.source is not None else Counter()

    def open(self) -> Pipeline[Any]:
        """Make the consumer, the source, its strategy and the pipeline, and subscribe."""
        source = KafkaSource(self.settings, self.binding, None, self.handoff, self.options,
                             SentMarks.for_binding(self.settings, self.binding))
        consumer = self._consumer_factory({
            **consumer_config(self.settings, self.group, self.options),
            "on_commit": source.on_commit})
        source.consumer = consumer
        source.partitions.start(consumer)
        strategy = self._around(source)
        pipeline = Pipeline(strategy, self.client, COMPONENT, self.binding.name, self.options,
                            self.hook)
        source.partitions.pipeline = pipeline
        self.source, self.strategy, self.pipeline = source, strategy, pipeline
        parts = source.partitions
        consumer.subscribe([self.binding.source.topic], on_assign=parts.on_assign,
                           on_revoke=parts.on_revoke, on_lost=parts.on_lost)
        return pipeline

    def _around(self, source: KafkaSource) -> OffsetSource[Any]:
        """The strategy the binding's records run by (see :func:`by_ordering`)."""
        return by_ordering(self.settings, source, self.client, self.options)

    def run(self, stop: threading.Event) -> None:
        """Tail until ``stop`` is set, then finish and commit the batches under way."""
        pipeline = self.open()
        source, strategy = self.source, self.strategy
        assert source is not None and strategy is not None
        log.info("tailer for binding %s started: topic %s, group %s, ordering %s",
                 self.binding.name, self.binding.source.topic, self.group,
                 self.binding.execution.ordering)
        done = threading.Event()  # ends the loops beside it with this run, whatever ends it
        beside = strategy.beside(done)
        try:
            pipeline.run(stop)
        except SchedulerUnavailable:
            log.warning("binding %s: stopping with a batch unresolved; its records will be "
                        "read again (not committed)", self.binding.name)
        finally:
            what = f"tailer for binding {self.binding.name}"
            leave_group(source.consumer, lambda: bool(source.owned), what)
            close_consumer(self._close, what)
            done.set()
            for loop in beside:
                loop.join(BESIDE_JOIN_S)
            metrics.set_in_flight(COMPONENT, self.binding.name, 0)
            log.info("tailer for binding %s stopped", self.binding.name)

    def _close(self) -> None:
        self.hook("close")
        if self.source is not None:
            self.source.consumer.close()

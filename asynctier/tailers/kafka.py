"""The Kafka source: one consumer group per binding, at-least-once checkpoints.

The pipeline (:mod:`asynctier.tailers.pipeline`) does the batching, the order and the
retries; this module is what is Kafka's own: the consumer (no decoding here: the scheduler
decodes), the hand-off of non-ok outcomes to delay and dead-letter topics
(:class:`~asynctier.delay_streams.handoff.Handoff`), commits per partition highest + 1,
and the rebalance callbacks. A partition that is revoked gets its batches finished,
confirmed and committed in the revoke callback; a lost partition is never committed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from asynctier.delay_streams.handoff import Handoff
from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError, SchedulerUnavailable
from asynctier.platform.kafka import (
    close_consumer,
    commit_past,
    consume_error,
    leave_group,
    tailer_consumer_config,
    take_over,
)
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.ordered import KeyGate, LaneKey
from asynctier.tailers.parked_runner import ParkedRunner, start_runner
from asynctier.tailers.parking import ParkingLot
from asynctier.tailers.pipeline import Hook, Pipeline, no_hook
from asynctier.tailers.source import Batch, Prepared

log = logging.getLogger(__name__)

COMPONENT = "tailer"

ConsumerFactory = Callable[[dict[str, Any]], Any]


def consumer_config(settings: Settings, group: str, options: TailerOptions) -> dict[str, Any]:
    """The main tailer's consumer (see :func:`tailer_consumer_config`)."""
    # Read-ahead is bounded (2 MiB queued, 1 MiB fetches: some 10,000 records of 100
    # bytes, a fraction of a second of work) so that a tailer's memory does not grow with
    # the backlog behind it; a larger record still comes through whole.
    return tailer_consumer_config(settings, group,
                                  session_timeout_ms=options.session_timeout_ms,
                                  max_poll_interval_ms=options.max_poll_interval_ms,
                                  fetch_wait_max_ms=50, queued_max_kbytes=2048,
                                  fetch_max_bytes=1 << 20)


#: Commit errors that mean "the group is rebalancing": worth a retry once it is through.
_REBALANCING = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                KafkaError._STATE)


class KafkaSource:
    """A binding's topic as a :class:`~asynctier.tailers.source.Source`."""

    def __init__(self, settings: Settings, binding: Binding, consumer: Any, handoff: Handoff,
                 options: TailerOptions) -> None:
        self.settings = settings
        self.binding = binding
        self.consumer = consumer
        self.handoff = handoff
        self.options = options
        self.what = f"binding {binding.name}"
        self.topic = binding.topic
        self.pipeline: Pipeline | None = None  # set by the tailer
        # assigned, neither revoked nor lost: only these are run and committed
        self.owned: set[tuple[str, int]] = set()
        self.committed: dict[tuple[str, int], int] = {}
        self.in_revoke = False
        self.stats: Counter[str] = Counter()
        # --ordering key: which records run now, which wait behind their key
        self.gate: KeyGate | None = None
        if binding.ordering == "key":
            self.gate = KeyGate(binding, ParkingLot.of(settings, binding.name),
                                options.batch_size)

    # -- reading --------------------------------------------------------------------------

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """``poll`` for the first record, then what the client holds already
        (``--ordering key``: only records whose key is idle, see :meth:`_read_ordered`)."""
        if self.gate is not None:
            return self._read_ordered(max_records, wait_s)
        return self._consume(max_records, wait_s)

    def _consume(self, max_records: int, wait_s: float) -> list[Any]:
        if wait_s <= 0:
            return list(self.consumer.consume(max_records, 0))
        first = self.consumer.poll(wait_s)
        if first is None:
            return []
        return [first, *self.consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]

    def prepare(self, records: list[Any]) -> Prepared:
        """One call of the records of owned partitions (consume errors are logged)."""
        if self.gate is not None:
            return self._prepare_ordered(records)
        name = self.binding.name
        good: list[Any] = []
        origins: list[str] = []
        call = CallBuilder()
        add, owned = call.add, self.owned
        high: dict[tuple[str, int], int] = {}  # per partition, the highest offset
        for at, msg in enumerate(records):
            if msg.error() is not None:
                consume_error(msg.error(), self.what, self.topic)
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            tp = (topic, partition)
            if tp not in owned:
                continue  # revoked or lost since it was read: its new owner runs it
            origin = f"{topic}/{partition}/{offset}"
            if not add(name, msg.value(), msg.key(), msg.headers(), 1, origin,
                       msg.timestamp()[1]):
                return Prepared(good, call.encode(), high, (origins, call.size), records[at:])
            good.append(msg)
            origins.append(origin)
            if offset > high.get(tp, -1):
                high[tp] = offset
        return Prepared(good, call.encode() if good else None, high, (origins, call.size))

    def _read_ordered(self, max_records: int, wait_s: float) -> list[Any]:
        """``--ordering key``: the next records of keys let go, then records read whose key
        is idle; the others wait in their key's lane (read no more while those are full)."""
        gate = self.gate
        assert gate is not None
        out = gate.take(max_records)
        self._pace(gate)
        if gate.full():
            if not out and wait_s > 0:
                time.sleep(min(wait_s, 0.05))  # until a batch under way lets keys go
            return out
        got = self._consume(max(1, max_records - len(out)), 0 if out else wait_s)
        return out + gate.admit(got) if got else out

    def _pace(self, gate: KeyGate) -> None:
        """Pause the partitions whose lanes are deep, resume those drained enough (from
        the position reached: nothing is skipped)."""
        stop, go = gate.pace()
        for tps, act in ((stop, self.consumer.pause), (go, self.consumer.resume)):
            if tps:
                try:
                    act([TopicPartition(t, p) for t, p in tps])
                except KafkaException as exc:
                    log.warning("%s: could not %s %d partition(s) (%s)", self.what,
                                "pause" if act == self.consumer.pause else "resume",
                                len(tps), exc.args[0].str())

    def _prepare_ordered(self, records: list[Any]) -> Prepared:
        """``--ordering key``: ``records`` have one record per key at most (the gate gave
        them out); a parked key's record goes behind it in Redis (resolved here: the
        batch's records past ``items``)."""
        gate = self.gate
        assert gate is not None
        good = []
        for msg in records:
            if msg.error() is not None:
                consume_error(msg.error(), self.what, self.topic)
            elif (msg.topic(), msg.partition()) in self.owned:
                good.append(msg)
            else:
                gate.drop(msg)
        try:
            run, parked, heads = gate.check(good)
        except HandoffError as exc:
            log.error("%s: %s; holding %d record(s) back, trying again in 1s", self.what,
                      exc, len(good))
            time.sleep(1.0)  # Redis is down: no record may run ahead of its key
            return Prepared([], None, rest=good)
        name = self.binding.name
        call = CallBuilder()
        add = call.add
        origins: list[str] = []
        okeys: list[LaneKey] = []
        sent: list[Any] = []
        rest: list[Any] = []
        for at, (msg, okey, origin) in enumerate(run):
            if not add(name, msg.value(), msg.key(), msg.headers(), 1, origin,
                       msg.timestamp()[1]):
                rest = [row[0] for row in run[at:]]  # the call is full: the next one
                break
            sent.append(msg)
            origins.append(origin)
            okeys.append(okey)
        gate.sent(okeys)
        batch = sent + [row[0] for row in parked]
        high: dict[tuple[str, int], int] = {}
        for msg in batch:
            tp = (msg.topic(), msg.partition())
            if msg.offset() > high.get(tp, -1):
                high[tp] = msg.offset()
        request = call.encode() if sent else None
        return Prepared(batch, request, high, (origins, call.size, okeys, heads, False),
                        rest, len(sent))

    def wait(self, batch: Batch, superseded: Callable[[], bool]) -> bool:
        """Wait for the answer while polling the consumer (its partitions paused).

        A call longer than ``max.poll.interval.ms`` (slow functions, a full queue) would
        otherwise push this consumer out of its group, and the batch would be read, run
        and never committed again and again.
        """
        assert batch.call is not None
        future = batch.call.future
        answered = threading.Event()
        future.add_done_callback(lambda _: answered.set())
        slice_s = min(1.0, self.options.max_poll_interval_ms / 4000)
        paused: list[TopicPartition] = []
        consumer = self.consumer
        try:
            while not answered.wait(slice_s):
                if not paused:
                    paused = [tp for tp in consumer.assignment() if self.gate is None
                              or (tp.topic, tp.partition) not in self.gate.paused]
                    consumer.pause(paused)  # resumed below, from the same position
                msg = consumer.poll(0)  # keeps the membership; serves rebalances
                if msg is not None and self.pipeline is not None:  # a partition assigned
                    self.pipeline.pending += (  # meanwhile
                        [msg] if self.gate is None else self.gate.admit([msg]))
                if superseded():
                    return False
        finally:
            if paused:
                with contextlib.suppress(KafkaException):
                    consumer.resume(paused)
        return True

    # -- resolving and committing ---------------------------------------------------------

    def hand_off(self, batch: Batch) -> Counter[str]:
        """Delay or dead-letter records for every non-ok outcome."""
        if self.gate is not None:
            origins, size, okeys, heads, released = batch.extra
            counts = self.gate.hand_off(self.handoff, batch.records, batch.items,
                                        batch.outcomes, okeys, origins, heads, released)
            batch.extra = (origins, size, okeys, heads, True)
            return counts
        origins, size = batch.extra
        return self.handoff.resolve_messages(self.binding, batch.records, batch.outcomes,
                                             origins, size)

    def confirm(self) -> None:
        """Every delay and dead-letter record so far delivered, or HandoffError."""
        self.handoff.confirm()

    def checkpoint(self, batch: Batch, sync: bool) -> None:
        """Commit past the batch's highest offset of each partition still owned:
        asynchronously in the loop, synchronously when draining (revoke, stop)."""
        owned = self.owned
        mark = batch.mark
        if self.gate is not None:
            mark = self.gate.limit(batch.records, mark)
        for done in commit_past(self.consumer, mark, lambda t, p: (t, p) in owned, sync,
                                self.what):
            self.committed[(done.topic, done.partition)] = done.offset

    def counted(self, batch: Batch) -> None:
        """Batch and outcome metrics."""
        metrics.count_batch(COMPONENT, self.binding.name)
        metrics.record_outcomes(self.binding.name, self.binding.tenant, batch.counts)
        self.stats.update(batch.counts)

    def checkpoint_final(self, scope: set[tuple[str, int]] | None) -> None:
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
        deadline = time.monotonic() + (0.0 if self.in_revoke else 10.0)
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
            self.consumer.poll(0.2)  # serves the rebalance; a record it returns is not run
            owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            mine = [tp for tp in mine if (tp.topic, tp.partition) in owned]
            if not mine:
                return

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The consumer's commit callback: a failed asynchronous commit is logged."""
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            log.warning("binding %s: a commit failed (%s); the next one covers it, or the "
                        "records are read again", self.binding.name, err.str())

    # -- rebalancing ----------------------------------------------------------------------

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Partitions assigned: they are run and committed from now on."""
        for tp in partitions:
            self.owned.add((tp.topic, tp.partition))
        log.info("binding %s: assigned %s", self.binding.name,
                 ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions) or "nothing")
        take_over(consumer, partitions, assign=True)

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Partitions revoked: finish, confirm and commit their batches first."""
        pipeline = self.pipeline
        if partitions:
            log.info("binding %s: revoking %s; finishing %d batch(es) under way",
                     self.binding.name,
                     ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions),
                     len(pipeline.in_flight) if pipeline else 0)
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.in_revoke = True  # no polling from inside a rebalance callback
        try:
            if pipeline is not None:
                pipeline.revoke(gone, lambda m: (m.topic(), m.partition()) in gone)
        finally:
            self.in_revoke = False
            self.owned -= gone
            self._forget_lanes(consumer, gone)
            take_over(consumer, partitions, assign=False)

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Partitions lost: never run nor committed here again, unless assigned again."""
        log.warning("binding %s: lost %s; their batches under way will not be committed",
                    self.binding.name,
                    ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions))
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.owned -= gone
        for tp in gone:
            self.committed.pop(tp, None)
        self._forget_lanes(consumer, gone)
        if self.pipeline is not None:
            self.pipeline.forget(lambda m: (m.topic(), m.partition()) in gone)
        take_over(consumer, partitions, assign=False)

    def _forget_lanes(self, consumer: Any, gone: set[tuple[str, int]]) -> None:
        """``--ordering key``: the gate forgets the partitions gone; those it paused are
        resumed first (a partition assigned again is read from the start)."""
        if self.gate is None:
            return
        paused = [TopicPartition(t, p) for t, p in gone if (t, p) in self.gate.paused]
        if paused:
            with contextlib.suppress(KafkaException):
                consumer.resume(paused)
        self.gate.forget(gone)


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
        self.source: KafkaSource | None = None
        self.pipeline: Pipeline | None = None

    @property
    def stats(self) -> Counter[str]:
        """What became of the records so far (ok, retry, dead_letter)."""
        return self.source.stats if self.source is not None else Counter()

    def open(self) -> Pipeline:
        """Make the consumer, the source and the pipeline, and subscribe."""
        source = self._source()
        consumer = self._consumer_factory({
            **consumer_config(self.settings, self.group, self.options),
            "on_commit": source.on_commit})
        source.consumer = consumer
        pipeline = Pipeline(source, self.client, COMPONENT, self.binding.name, self.options,
                            self.hook)
        source.pipeline = pipeline
        self.source, self.pipeline = source, pipeline
        consumer.subscribe([self.binding.topic], on_assign=source.on_assign,
                           on_revoke=source.on_revoke, on_lost=source.on_lost)
        return pipeline

    def _source(self) -> KafkaSource:
        """The source of this tailer (its consumer is set by :meth:`open`)."""
        return KafkaSource(self.settings, self.binding, None, self.handoff, self.options)

    def run(self, stop: threading.Event) -> None:
        """Tail until ``stop`` is set, then finish and commit the batches under way."""
        pipeline = self.open()
        source = self.source
        assert source is not None
        log.info("tailer for binding %s started: topic %s, group %s%s",
                 self.binding.name, self.binding.topic, self.group,
                 ", ordered by key" if source.gate is not None else "")
        runner = None
        runner_stop = threading.Event()  # ends with this run, whatever ends it
        if source.gate is not None:
            runner = start_runner(ParkedRunner(self.binding, self.client, source.gate.lot,
                                               Handoff(self.settings),
                                               self.options.batch_size), runner_stop,
                                  self.settings.restarts)
        try:
            pipeline.run(stop)
        except SchedulerUnavailable:
            log.warning("binding %s: stopping with a batch unresolved; its records will be "
                        "read again (not committed)", self.binding.name)
        finally:
            what = f"tailer for binding {self.binding.name}"
            leave_group(source.consumer, lambda: bool(source.owned), what)
            close_consumer(self._close, what)
            runner_stop.set()
            if runner is not None:
                runner.join(60.0)
            metrics.set_in_flight(COMPONENT, self.binding.name, 0)
            log.info("tailer for binding %s stopped", self.binding.name)

    def _close(self) -> None:
        self.hook("close")
        if self.source is not None:
            self.source.consumer.close()

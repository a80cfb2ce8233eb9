"""The Kafka tailer: one consumer group per binding, at-least-once checkpoints.

Loop: ``consume(n)`` a batch, turn it into Items (no decoding here: the scheduler decodes),
start the submit call, and while it runs fetch the next batch (at most ``max_in_flight``
batches under way). Batches are resolved in order: every non-ok outcome is handed off to a
delay or dead-letter topic, and the batch waits, uncommitted, while those records travel.
A batch with records to hand off is not handed off the moment its answer comes: the next
batch is sent to the scheduler first, and the hand-offs are produced while it runs (the
loop would otherwise sit waiting for that answer), or at once when there is nothing to
send. At the next hand-off (or when the loop has nothing else to do) the earlier hand-offs
are confirmed (flush returned 0, every delivery report good) and only then the waiting
batches' offsets are committed, oldest first, per partition highest + 1: the wait for
delivery overlaps with the next batch's work instead of stalling the loop. A failed
hand-off means no commit and another try. A partition that is revoked gets its batches
finished, confirmed and committed in the revoke callback; a lost partition is never
committed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from asynctier.delay_streams.handoff import Handoff
from asynctier.dev.faults import FaultHook
from asynctier.platform import metrics, wire
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError, SchedulerUnavailable
from asynctier.platform.kafka import close_consumer, leave_group, tailer_consumer_config, take_over
from asynctier.platform.rpc import MAX_CALL_BYTES, PendingCall, SchedulerClient, header_bytes
from asynctier.platform.wire import Outcome
from asynctier.tailers.options import TailerOptions

log = logging.getLogger(__name__)

COMPONENT = "tailer"


@dataclass
class _Batch:
    messages: list[Any]
    call: PendingCall
    high: dict[tuple[str, int], int]  # per partition, the highest offset in the batch
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    origins: list[str] = field(default_factory=list)  # each message's topic/partition/offset
    size: int | None = None  # bytes of the keys, values and headers of the messages

    @property
    def handed_off(self) -> bool:
        """True when some of its records went to a delay or dead-letter topic."""
        return self.counts["ok"] != len(self.messages)


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


def _complete(outcomes: list[Outcome], n: int) -> list[Outcome]:
    """One outcome per item: an item the scheduler said nothing about is unknown, so it is
    retried, never taken as done."""
    if len(outcomes) == n and len({o["id"] for o in outcomes}) == n:
        return outcomes
    seen = {o["id"] for o in outcomes if 0 <= o["id"] < n}
    missing = [wire.retry(i, "the scheduler returned no outcome for this item")
               for i in range(n) if i not in seen]
    log.error("a scheduler answered %d outcome(s) for %d item(s); retrying %d unknown",
              len(outcomes), n, len(missing))
    return [o for o in outcomes if 0 <= o["id"] < n] + missing


#: Commit errors that mean "the group is rebalancing": worth a retry once it is through.
_REBALANCING = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                KafkaError._STATE)


class KafkaTailer:
    """Tails one binding's topic in the group ``<prefix>.<binding>``."""

    def __init__(self, settings: Settings, binding: Binding, client: SchedulerClient,
                 options: TailerOptions | None = None) -> None:
        self.settings = settings
        self.binding = binding
        self.client = client
        self.options = options or TailerOptions()
        self.group = settings.names.group(binding.name)
        self.handoff = Handoff(settings)
        self._in_flight: deque[_Batch] = deque()
        # answered, hand-offs not produced yet: produced while the next call runs
        self._answered: list[_Batch] = []
        self._handed: list[_Batch] = []  # resolved, hand-offs not yet confirmed: uncommitted
        self._no_more_commits = False  # set when stopping with an unconfirmed hand-off
        self._next: list[Any] = []
        self._next_since = 0.0
        # assigned, neither revoked nor lost: only these are run and committed
        self._owned: set[tuple[str, int]] = set()
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        self.stats: Counter[str] = Counter()
        self._in_revoke = False
        self._commit_sync = False
        self._committed: dict[tuple[str, int], int] = {}
        self._fault = FaultHook.from_env()  # a no-op unless ASYNCTIER_FAULT is set (tests)

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tail until ``stop`` is set, then finish and commit the batches under way."""
        self._stop = stop
        consumer = Consumer({**consumer_config(self.settings, self.group, self.options),
                             "on_commit": self._on_commit})
        self._consumer = consumer
        consumer.subscribe([self.binding.topic], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("tailer for binding %s started: topic %s, group %s",
                 self.binding.name, self.binding.topic, self.group)
        try:
            while not stop.is_set():
                self._step(consumer)
            self._drain()
        except SchedulerUnavailable:
            log.warning("binding %s: stopping with a batch unresolved; its records will be "
                        "read again (not committed)", self.binding.name)
        finally:
            what = f"tailer for binding {self.binding.name}"
            leave_group(consumer, lambda: bool(self._owned), what)
            close_consumer(self._close, what)
            metrics.set_in_flight(COMPONENT, self.binding.name, 0)
            log.info("tailer for binding %s stopped", self.binding.name)

    def _close(self) -> None:
        self._fault.reached("close")
        if self._consumer is not None:
            self._consumer.close()

    def _step(self, consumer: Consumer) -> None:
        in_flight, size = self._in_flight, self.options.batch_size
        if in_flight and (len(in_flight) >= self.options.max_in_flight
                          or in_flight[0].call.future.done()):
            if self._answered and not in_flight[0].call.future.done():
                self._hand_off_answered()  # while the scheduler works on what it has
            else:
                self._resolve_oldest()
            return
        # With nothing under way a batch leaves at once (low latency when records trickle
        # in). While one is under way the next one fills up, for at most linger_s, before it
        # leaves (throughput under load without holding records back for long).
        nxt, now = self._next, time.monotonic()
        if not nxt:
            self._next_since = now
        if len(nxt) < size:
            wait = max(0.0, self.options.linger_s - (now - self._next_since)) if in_flight else 0
            got = consumer.consume(size - len(nxt), wait)
            # consume() serves rebalance callbacks: a revoke or a loss replaces self._next
            # by a list without the records of the partitions gone, so the list is taken
            # again here (one held across the call would run those records here while
            # their new owner runs them too, or drop what consume() returned).
            nxt = self._next
            nxt += got
        if nxt and (len(nxt) >= size or not in_flight
                    or time.monotonic() - self._next_since >= self.options.linger_s):
            self._next = []
            self._submit(nxt)
        elif self._answered:  # nothing to send yet: hand off now, not after the call under
            self._hand_off_answered()  # way (a slow one would hold these retries back)
        elif not in_flight:
            if self._handed:  # nothing else to do: confirm and commit what was handed off
                self._settle()
                return
            first = consumer.poll(self.options.idle_poll_s)
            if first is not None:
                self._next_since = time.monotonic()
                self._next = [first]
                got = consumer.consume(size - 1, 0)  # may serve a rebalance (see above)
                self._next += got

    def _submit(self, messages: list[Any]) -> None:
        name = self.binding.name
        good: list[Any] = []
        origins: list[str] = []
        cols = wire.Columns()
        add = cols.add
        owned = self._owned
        high: dict[tuple[str, int], int] = {}  # per partition, the highest offset
        size, cap = 0, MAX_CALL_BYTES
        for at, msg in enumerate(messages):
            if msg.error() is not None:
                self._log_consume_error(msg.error())
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            tp = (topic, partition)
            if tp not in owned:
                continue  # revoked or lost since it was read: its new owner runs it
            value, key, headers = msg.value(), msg.key(), msg.headers()
            size += (len(value) if value else 0) + (len(key) if key else 0)
            if headers:
                size += header_bytes(headers)
            if size > cap and good:  # large records: the rest go in the next call
                self._next = messages[at:] + self._next
                break
            origin = f"{topic}/{partition}/{offset}"
            add(name, value, key, headers, 1, origin, msg.timestamp()[1])
            good.append(msg)
            origins.append(origin)
            if offset > high.get(tp, -1):
                high[tp] = offset
        if not good:
            return
        self._fault.reached("before-rpc")
        self._in_flight.append(_Batch(good, self.client.submit_encoded(cols.encode(),
                                                                        len(good)), high,
                                      origins=origins, size=size))
        self._fault.reached("mid-batch")
        metrics.add_in_flight(COMPONENT, name, len(good))

    def _log_consume_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        log.error("binding %s: consume error on %s: %s", self.binding.name,
                  self.binding.topic, err.str())
        if err.fatal():
            raise KafkaException(err)

    # -- resolving and committing ---------------------------------------------------------

    def _resolve_oldest(self) -> None:
        batch = self._in_flight[0]
        if not self._wait_in_group(batch):
            return  # a revoke served while waiting resolved and committed it
        batch.outcomes = outcomes = _complete(batch.call.result(self._stop),
                                              len(batch.messages))
        self._in_flight.popleft()
        metrics.add_in_flight(COMPONENT, self.binding.name, -len(batch.messages))
        self._answered.append(batch)
        if (len(self._answered) < self.options.max_in_flight and self._in_flight
                and any(o["status"] != "ok" for o in outcomes)):
            # Records to hand off: the next batch goes to the scheduler first, and these
            # are produced while it runs (the loop would otherwise wait for the answer
            # doing nothing); a batch that is all ok is committed at once.
            return
        self._hand_off_answered()

    def _hand_off_answered(self) -> None:
        """Produce the hand-offs of the answered batches, oldest first. The hand-offs of
        earlier batches have been on their way meanwhile: they are confirmed and committed
        first, so that the wait for their delivery overlaps with work."""
        self._settle()
        answered, self._answered = self._answered, []
        for batch in answered:
            self._hand_off(batch)
            self._handed.append(batch)
        if not any(batch.handed_off for batch in self._handed):
            self._settle()  # nothing to confirm: commit now

    def _settle(self) -> None:
        """Confirm every hand-off made so far, then commit those batches, oldest first."""
        handed = self._handed
        if not handed:
            return
        if any(batch.handed_off for batch in handed):
            self._confirm()
        self._handed = []
        for batch in handed:
            self._fault.reached("before-commit")
            self._commit(batch.high)
            metrics.count_batch(COMPONENT, self.binding.name)
            metrics.record_outcomes(self.binding.name, self.binding.tenant, batch.counts)
            self.stats.update(batch.counts)

    def _wait_in_group(self, batch: _Batch) -> bool:
        """Wait for a batch's answer while polling the consumer (its partitions paused).

        A call longer than ``max.poll.interval.ms`` (slow functions, a full queue) would
        otherwise push this consumer out of its group, and the batch would be read, run
        and never committed again and again. False when a revoke served by the poll
        resolved the batch in the meantime.
        """
        consumer, future = self._consumer, batch.call.future
        if consumer is None or self._in_revoke or future.done():
            return True
        answered = threading.Event()
        future.add_done_callback(lambda _: answered.set())
        slice_s = min(1.0, self.options.max_poll_interval_ms / 4000)
        paused: list[TopicPartition] = []
        try:
            while not answered.wait(slice_s):
                if not paused:
                    paused = consumer.assignment()
                    consumer.pause(paused)  # resumed below, from the same position
                msg = consumer.poll(0)  # keeps the membership; serves rebalances
                if msg is not None:  # from a partition assigned meanwhile
                    self._next.append(msg)
                if not self._in_flight or self._in_flight[0] is not batch:
                    return False
        finally:
            if paused:
                with contextlib.suppress(KafkaException):
                    consumer.resume(paused)
        return True

    def _hand_off(self, batch: _Batch) -> None:
        """Produce every non-ok outcome of ``batch`` (confirmed later, by :meth:`_confirm`);
        retry until produced or stopping."""
        while True:
            try:  # produce() itself can refuse a record
                batch.counts = self.handoff.resolve_messages(
                    self.binding, batch.messages, batch.outcomes, batch.origins or None,
                    batch.size)
                return
            except HandoffError as exc:
                self._handoff_failed(exc, len(batch.messages))

    def _confirm(self) -> None:
        """Wait until every hand-off produced so far is delivered; when one was not, produce
        the hand-offs of every unconfirmed batch again (never commit over a lost one)."""
        while True:
            try:
                self.handoff.confirm()
                return
            except HandoffError as exc:
                self._handoff_failed(exc, sum(len(b.messages) - b.counts["ok"]
                                              for b in self._handed))
            for batch in self._handed:
                if batch.handed_off:
                    self._hand_off(batch)

    def _handoff_failed(self, exc: HandoffError, records: int) -> None:
        metrics.count_handoff_failure(self.binding.topic)
        log.error("binding %s: hand-off of %d record(s) to delay/dead-letter topics "
                  "was not confirmed (%s); not committing, trying again in %gs. "
                  "Check that the delay and dead-letter topics exist and accept "
                  "records of this size.", self.binding.name, records, exc,
                  self.options.handoff_retry_s)
        if self._stop.wait(self.options.handoff_retry_s):
            # Stopping with records whose hand-off never landed: nothing more may be
            # committed by this tailer (a later batch's offsets would cover them), and the
            # batches it holds are dropped; all of it is read again from the last commit.
            self._no_more_commits = True
            self._drop_batches()
            raise SchedulerUnavailable("stopping with an unconfirmed hand-off") from exc

    def _drop_batches(self) -> None:
        """Drop every batch held, answered or not: none of them will be committed here."""
        self._in_flight.clear()
        self._answered = []
        self._handed = []

    def _commit(self, high: dict[tuple[str, int], int]) -> None:
        """Commit past the highest offsets of a batch (``high``: per partition)."""
        # Only partitions this tailer still owns: a position committed for a partition
        # another consumer took over (here, or later by _commit_positions at stop) would
        # move that consumer's committed offset back.
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in high.items()
                   if (t, p) in self._owned]
        if not offsets or self._consumer is None or self._no_more_commits:
            return
        for done in offsets:
            self._committed[(done.topic, done.partition)] = done.offset
        try:  # asynchronous in the loop (a failure is logged by _on_commit and a later
            # commit covers it); synchronous when draining (revoke, stop)
            if self._commit_sync:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            else:
                self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            log.warning("binding %s: commit of %s failed (%s); those records will be read "
                        "again", self.binding.name,
                        ", ".join(f"{t.topic}/{t.partition}@{t.offset}" for t in offsets),
                        exc.args[0].str())

    def _drain(self, partitions: set[tuple[str, int]] | None = None) -> None:
        """Resolve every batch under way, then commit synchronously where this tailer
        stands on ``partitions`` (all when None): an asynchronous commit still on its way
        must land before another consumer takes a partition over."""
        was_sync, self._commit_sync = self._commit_sync, True
        try:
            while self._in_flight:
                self._resolve_oldest()
            self._hand_off_answered()
            self._settle()
            self._commit_positions(partitions)
        finally:
            self._commit_sync = was_sync  # a revoke served while stopping keeps it synchronous

    def _commit_positions(self, partitions: set[tuple[str, int]] | None) -> None:
        mine = [TopicPartition(t, p, o) for (t, p), o in self._committed.items()
                if (partitions is None or (t, p) in partitions) and (t, p) in self._owned]
        if partitions is not None:
            for tp in partitions:
                self._committed.pop(tp, None)
        consumer = self._consumer
        if not mine or consumer is None or self._no_more_commits:
            return
        # When stopping (not inside a rebalance callback), a commit refused because the
        # group is rebalancing is tried again once the rebalance is through, for the
        # partitions this tailer still owns; otherwise they would be read again.
        deadline = time.monotonic() + (0.0 if self._in_revoke else 10.0)
        while True:
            try:
                consumer.commit(offsets=mine, asynchronous=False)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() not in _REBALANCING or time.monotonic() >= deadline:
                    log.warning("binding %s: final commit failed (%s); the records after "
                                "the last commit that landed will be read again",
                                self.binding.name, error.str())
                    return
            consumer.poll(0.2)  # serves the rebalance; a record it returns is not run
            owned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            mine = [tp for tp in mine if (tp.topic, tp.partition) in owned]
            if not mine:
                return

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            log.warning("binding %s: a commit failed (%s); the next one covers it, or the "
                        "records are read again", self.binding.name, err.str())

    # -- rebalancing ----------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._owned.add((tp.topic, tp.partition))
        log.info("binding %s: assigned %s", self.binding.name,
                 ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions) or "nothing")
        take_over(consumer, partitions, assign=True)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            log.info("binding %s: revoking %s; finishing %d batch(es) under way",
                     self.binding.name,
                     ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions),
                     len(self._in_flight))
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._next = [m for m in self._next if (m.topic(), m.partition()) not in gone]
        self._in_revoke = True  # no polling from inside a rebalance callback
        try:
            self._drain(gone)
        except SchedulerUnavailable:
            self._drop_batches()
        finally:
            self._in_revoke = False
            self._owned -= gone
            take_over(consumer, partitions, assign=False)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("binding %s: lost %s; their batches under way will not be committed",
                    self.binding.name,
                    ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions))
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._owned -= gone  # never run nor committed here again, unless assigned again
        for tp in gone:
            self._committed.pop(tp, None)
        self._next = [m for m in self._next if (m.topic(), m.partition()) not in gone]
        take_over(consumer, partitions, assign=False)

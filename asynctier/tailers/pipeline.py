"""The pipeline: any source checkpointed in order (:class:`~asynctier.tailers.source.Source`),
at least once.

Loop: read a batch, send it to a scheduler, and while it runs read the next (at most
``max_in_flight`` batches under way). Batches are resolved in order: every non-ok outcome
is handed off by the source, and the batch waits, not checkpointed, while those writes
travel. A batch with records to hand off is not handed off the moment its answer comes:
the next batch is sent first, and the hand-offs are written while it runs (or at once
when there is nothing to send). At the next hand-off (or when there is nothing else to
do) the earlier hand-offs are confirmed and only then the waiting batches are
checkpointed, oldest first: the wait for durability overlaps with the next batch's work.
A refused or unconfirmed hand-off means no checkpoint and another try.

An answer that does not name every item of the batch exactly once (or fails another check
of :mod:`asynctier.platform.replies`) is not taken: the batch is sent again, and nothing is
resolved or checkpointed on its word.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic

from asynctier.platform import metrics
from asynctier.platform.errors import HandoffError, SchedulerUnavailable
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers.options import PipelineOptions
from asynctier.tailers.source import TP, Batch, E, Source

log = logging.getLogger(__name__)

#: A point of the pipeline a test may act at (``read``, ``before-rpc``, ``mid-batch``,
#: ``before-commit``): see :mod:`asynctier.dev.faults`.
Hook = Callable[[str], None]


def no_hook(point: str) -> None:
    """The hook of a pipeline that nobody watches."""


class Pipeline(Generic[E]):
    """Drives one source: read, submit, resolve in order, checkpoint."""

    def __init__(self, source: Source[E], client: SchedulerClient, component: str,
                 metric_name: str, options: PipelineOptions | None = None,
                 hook: Hook = no_hook) -> None:
        self.source = source
        self.client = client
        self.component = component  # metrics: "tailer", "delay"
        self.metric_name = metric_name  # metrics: the binding, or the delay interval
        self.options = options or PipelineOptions()
        self.hook = hook
        self.stop = threading.Event()
        self.in_flight: deque[Batch[E]] = deque()
        self.answered: list[Batch[E]] = []  # hand-offs not produced yet
        self.handed: list[Batch[E]] = []  # hand-offs produced, not confirmed: not checkpointed
        self.pending: list[Any] = []  # read, not sent yet
        self._pending_since = 0.0
        self.no_more_checkpoints = False  # stopping with an unconfirmed hand-off
        self.sync = False  # checkpoints land before returning (revoke, stop)
        self.draining = False  # inside a drain (a revoke): no polling the source

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set, then finish and checkpoint the batches under way.
        SchedulerUnavailable: stopped with a batch unresolved (not checkpointed)."""
        self.stop = stop
        while not stop.is_set():
            self.step()
        self.drain()

    def step(self) -> None:
        """One turn: resolve the oldest answer, or read and send, or wait for work."""
        in_flight, size, opts = self.in_flight, self.options.batch_size, self.options
        if in_flight and (len(in_flight) >= opts.max_in_flight or _done(in_flight[0])):
            if self.answered and not _done(in_flight[0]):
                self.hand_off_answered()  # while the scheduler works on what it has
            else:
                self.resolve_oldest()
            return
        # With nothing under way a batch leaves at once (low latency when records trickle
        # in). While one is under way the next one fills up, for at most linger_s, before
        # it leaves (throughput under load without holding records back for long).
        now = time.monotonic()
        if not self.pending:
            self._pending_since = now
        if len(self.pending) < size and (in_flight or self.pending):
            wait = max(0.0, opts.linger_s - (now - self._pending_since)) if in_flight else 0
            got = self.read(size - len(self.pending), wait)
            # read() may serve a revoke, which replaces self.pending by a list without the
            # records of the partitions gone: the list is taken again here
            self.pending += got
        pending = self.pending
        if pending and (len(pending) >= size or not in_flight
                        or time.monotonic() - self._pending_since >= opts.linger_s):
            self.pending = []
            self.submit(pending)
        elif self.answered:  # nothing to send yet: hand off now, not after the call under
            self.hand_off_answered()  # way (a slow one would hold these retries back)
        elif not in_flight:
            if self.handed:  # nothing else to do: confirm and checkpoint what was handed off
                self.settle()
                return
            got = self.read(size, opts.idle_poll_s)
            if got:
                self._pending_since = time.monotonic()
                self.pending += got

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """The source's next records (the ``read`` point of the fault hook first)."""
        self.hook("read")
        return self.source.read(max_records, wait_s)

    def submit(self, records: list[Any]) -> None:
        """Send ``records`` as one call (what does not fit waits for the next)."""
        prepared = self.source.prepare(records)
        if prepared.rest:
            self.pending = prepared.rest + self.pending
        if not prepared.records:
            if prepared.rest:  # all of it waits behind a batch (per-key order): let one go
                if self.answered:
                    self.hand_off_answered()
                elif self.in_flight:
                    self.resolve_oldest()
                else:  # held back by the source (a store it needs is down): ask again
                    self.stop.wait(self.options.handoff_retry_s)  # after the hand-offs' wait
            return
        call = None
        items = len(prepared.records) if prepared.items is None else prepared.items
        if prepared.request is not None:
            self.hook("before-rpc")
            call = self.client.submit_encoded(prepared.request, items, self.metric_name)
        self.in_flight.append(Batch(prepared.records, call, items, prepared.mark,
                                    prepared.extra))
        self.hook("mid-batch")
        metrics.add_in_flight(self.component, self.metric_name, len(prepared.records))

    def forget(self, gone: Callable[[Any], bool]) -> None:
        """Drop the records read and not sent for which ``gone(record)`` (a revoke)."""
        self.pending = [r for r in self.pending if not gone(r)]

    # -- resolving and checkpointing ------------------------------------------------------

    def resolve_oldest(self) -> None:
        """Wait for the oldest batch's answer and take its outcomes."""
        batch = self.in_flight[0]
        if batch.call is not None:
            if not self.draining and not batch.call.future.done() and not self.source.wait(
                    batch, lambda: not self.in_flight or self.in_flight[0] is not batch):
                return  # a revoke served while waiting resolved and checkpointed it
            batch.outcomes = batch.call.result(self.stop)
        self.in_flight.popleft()
        metrics.add_in_flight(self.component, self.metric_name, -len(batch.records))
        self.answered.append(batch)
        if (len(self.answered) < self.options.max_in_flight and self.in_flight
                and any(o["status"] != "ok" for o in batch.outcomes)):
            # Records to hand off: the next batch goes to the scheduler first, and these
            # are written while it runs; a batch that is all ok is checkpointed at once.
            return
        self.hand_off_answered()

    def hand_off_answered(self) -> None:
        """Write the hand-offs of the answered batches, oldest first. The hand-offs of
        earlier batches have been on their way meanwhile: they are confirmed and
        checkpointed first, so that the wait for them overlaps with work."""
        self.settle()
        answered, self.answered = self.answered, []
        for batch in answered:
            self._hand_off(batch)
            self.handed.append(batch)
        if not any(batch.handed_off for batch in self.handed):
            self.settle()  # nothing to confirm: checkpoint now

    def settle(self) -> None:
        """Confirm every hand-off made so far, then checkpoint those batches, oldest
        first."""
        handed = self.handed
        if not handed:
            return
        if any(batch.handed_off for batch in handed):
            self._confirm()
        self.handed = []
        for batch in handed:
            self.hook("before-commit")
            if not self.no_more_checkpoints:
                self.source.checkpoint(batch, self.sync)
            self.source.counted(batch)

    def _hand_off(self, batch: Batch[E]) -> None:
        """Write every non-ok outcome of ``batch`` (confirmed later); retry until written
        or stopping."""
        while True:
            try:
                batch.counts = self.source.hand_off(batch)
                return
            except HandoffError as exc:
                self._handoff_failed(exc, len(batch.records))

    def _confirm(self) -> None:
        """Wait until every hand-off so far is durable; when one was not, write the
        hand-offs of every unconfirmed batch again (never checkpoint over a lost one)."""
        while True:
            try:
                self.source.confirm()
                return
            except HandoffError as exc:
                self._handoff_failed(exc, sum(len(b.records) - b.counts["ok"]
                                              for b in self.handed))
            for batch in self.handed:
                if batch.handed_off:
                    self._hand_off(batch)

    def _handoff_failed(self, exc: HandoffError, records: int) -> None:
        metrics.count_handoff_failure(self.source.topic)
        log.error("%s: hand-off of %d record(s) was not confirmed (%s); not checkpointing, "
                  "trying again in %gs. Check that the delay and dead-letter topics (or the "
                  "queue's database) exist and accept records of this size.",
                  self.source.what, records, exc, self.options.handoff_retry_s)
        if self.stop.wait(self.options.handoff_retry_s):
            # Stopping with records whose hand-off never landed: nothing more may be
            # checkpointed (a later checkpoint would cover them), and the batches held are
            # dropped; all of it is read again from the last checkpoint.
            self.no_more_checkpoints = True
            self.drop_batches()
            raise SchedulerUnavailable("stopping with an unconfirmed hand-off") from exc

    def drop_batches(self) -> None:
        """Drop every batch held, answered or not: none of them will be checkpointed."""
        for batch in self.in_flight:
            metrics.add_in_flight(self.component, self.metric_name, -len(batch.records))
        self.in_flight.clear()
        self.answered = []
        self.handed = []

    def drain(self, scope: set[TP] | None = None) -> None:
        """Resolve every batch under way, then make the checkpoints of ``scope`` land
        (None: all; Kafka: the partitions revoked)."""
        was_sync, self.sync = self.sync, True
        try:
            while self.in_flight:
                self.resolve_oldest()
            self.hand_off_answered()
            self.settle()
            if not self.no_more_checkpoints:
                self.source.checkpoint_final(scope)
        finally:
            self.sync = was_sync  # a revoke served while stopping keeps it synchronous

    def revoke(self, scope: set[TP], gone: Callable[[Any], bool]) -> None:
        """Finish everything under way before records of ``scope`` go to another reader
        (from a rebalance callback: the source is not polled meanwhile)."""
        self.forget(gone)
        was, self.draining = self.draining, True
        try:
            self.drain(scope)
        except SchedulerUnavailable:
            self.drop_batches()
        finally:
            self.draining = was


def _done(batch: Batch[Any]) -> bool:
    return batch.call is None or batch.call.future.done()

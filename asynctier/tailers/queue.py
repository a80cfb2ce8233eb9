"""The queue source: a binding's queue topic, leased a batch at a time.

The pipeline (:mod:`asynctier.tailers.pipeline`) sends each leased batch to a scheduler
with the same call a Kafka batch takes (priority filled in); this module resolves the
outcomes the queue's way, all of a batch in one transaction: ok -> ack, retry(after) ->
nack, available again after the delay (the binding's ladder, or ``Retry(after=)``
exactly: the queue needs no hops), failed or out of attempts -> a dead item with its
reason. While a batch runs, its leases are extended; a tailer that dies stops extending
them, and the items are leased again elsewhere once their leases run out.

Wake-up: a bounded poll. An empty lease is not asked again for :data:`IDLE_POLL_S`
(measured: one lease query on an empty topic costs PostgreSQL about 0.1 ms; ten a second
per tailer is nothing, and a record waits at most that long).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from asynctier.delay_streams.ladder import ladder_delay
from asynctier.platform import metrics, wire
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, HandoffError, SchedulerUnavailable
from asynctier.platform.rpc import SchedulerClient
from asynctier.queue.items import Dead, Leased, Nack
from asynctier.queue.shards import ShardedQueue
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import Hook, Pipeline, no_hook
from asynctier.tailers.source import Batch, Prepared

log = logging.getLogger(__name__)

COMPONENT = "tailer"
#: How long an empty topic is left alone before it is leased from again.
IDLE_POLL_S = 0.1
#: A lease is extended when less than this share of it is left.
EXTEND_WHEN_LEFT = 2 / 3


def source_ref(item: Leased) -> str:
    """The item's reference for the scheduler (run-once key, ``ctx.source``)."""
    return f"queue/{item.namespace}/{item.topic}/{item.id}"


def lease_owner(binding: Binding) -> str:
    """A lease owner name unique to this tailer: host, process, binding, a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{binding.name}:{uuid.uuid4().hex[:8]}"


class QueueSource:
    """A binding's queue topic as a :class:`~asynctier.tailers.source.Source`."""

    def __init__(self, binding: Binding, queue: ShardedQueue, owner: str,
                 stop: threading.Event) -> None:
        self.binding = binding
        self.queue = queue
        self.owner = owner
        self.stop = stop
        self.what = f"binding {binding.name}"
        self.topic = binding.topic
        self.namespace = binding.tenant
        self.pipeline: Pipeline | None = None  # set by the tailer
        self.stats: Counter[str] = Counter()
        self._quiet_until = 0.0
        self._down_logged = 0.0
        self._expires_ms: dict[str, float] = {}  # leases extended here: when they end

    # -- reading --------------------------------------------------------------------------

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """Lease up to ``max_records`` ready items; an empty topic is asked again only
        after :data:`IDLE_POLL_S` (waiting at most ``wait_s`` here)."""
        self.keep_leases()
        now = time.monotonic()
        if now < self._quiet_until:
            self.stop.wait(min(wait_s, self._quiet_until - now))
            if time.monotonic() < self._quiet_until:
                return []
        try:
            leased = self.queue.lease(self.namespace, self.topic, max_records,
                                      self.binding.lease_s, self.owner,
                                      max_attempts=self.binding.max_attempts)
        except AsynctierError as exc:
            self._unavailable(exc)
            self._quiet_until = time.monotonic() + 1.0
            return []
        if not leased:
            self._quiet_until = time.monotonic() + IDLE_POLL_S
        metrics.count_lease_expiries(self.binding.name, self.namespace,
                                     sum(1 for item in leased if item.lease_ran_out))
        return leased

    def _unavailable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._down_logged >= 30.0:
            self._down_logged = now
            log.error("binding %s: cannot lease from queue topic %s (%s); trying again every "
                      "second", self.binding.name, self.topic, exc)

    def prepare(self, records: list[Any]) -> Prepared:
        """One call of the leased items (each keeps its priority)."""
        name = self.binding.name
        call = CallBuilder()
        for at, item in enumerate(records):
            if not call.add(name, item.payload, item.id.encode(), item.headers, item.attempt,
                            source_ref(item), item.enqueued_ms, item.priority):
                return Prepared(records[:at], call.encode(), None, None, records[at:])
        return Prepared(records, call.encode() if records else None)

    def wait(self, batch: Batch, superseded: Callable[[], bool]) -> bool:
        """Wait for the answer, extending the leases of everything under way."""
        assert batch.call is not None
        future = batch.call.future
        answered = threading.Event()
        future.add_done_callback(lambda _: answered.set())
        step = max(0.05, self.binding.lease_s * (1 - EXTEND_WHEN_LEFT) / 2)
        while not answered.wait(step):
            self.keep_leases()
            if self.stop.is_set():
                break
        return True

    def keep_leases(self) -> None:
        """Extend the leases of the items under way that are past a third of theirs."""
        pipeline = self.pipeline
        if pipeline is None or not pipeline.in_flight:
            return
        now_ms = time.time() * 1000
        left_ms = self.binding.lease_s * 1000 * EXTEND_WHEN_LEFT
        expires = self._expires_ms
        ids = [item.id for batch in pipeline.in_flight for item in batch.records
               if expires.get(item.id, item.lease_expires_ms) - now_ms < left_ms]
        if not ids:
            return
        try:
            held = set(self.queue.extend_lease(self.namespace, self.topic, self.owner, ids,
                                               self.binding.lease_s))
        except AsynctierError as exc:
            self._unavailable(exc)
            return
        until = now_ms + self.binding.lease_s * 1000
        for item_id in held:
            expires[item_id] = until
        lost = len(ids) - len(held)
        if lost:
            log.warning("binding %s: %d item(s) of queue topic %s lost their lease while "
                        "running (leased again elsewhere); their outcome here is ignored",
                        self.binding.name, lost, self.topic)

    # -- resolving ------------------------------------------------------------------------

    def hand_off(self, batch: Batch) -> Counter[str]:
        """Acks, nacks and dead items of the whole batch, in one transaction."""
        counts: Counter[str] = Counter()
        acks: list[str] = []
        nacks: list[Nack] = []
        deads: list[Dead] = []
        records: list[Leased] = batch.records
        for outcome in batch.outcomes:
            item = records[outcome["id"]]
            self._expires_ms.pop(item.id, None)
            what = self._resolution(item, outcome, acks, nacks, deads)
            counts[what] += 1
        try:
            self.queue.resolve(self.namespace, self.topic, self.owner, acks, nacks, deads)
        except AsynctierError as exc:
            raise HandoffError(f"queue topic {self.topic}: {exc}") from exc
        return counts

    def _resolution(self, item: Leased, outcome: wire.Outcome, acks: list[str],
                    nacks: list[Nack], deads: list[Dead]) -> str:
        status, binding = outcome["status"], self.binding
        if status == "ok":
            acks.append(item.id)
            return "ok"
        error = outcome["error"] or status
        if status == "failed":
            deads.append(Dead(item.id, outcome["reason"] or wire.REJECTED, error))
            return "dead_letter"
        spends = outcome["spends_attempt"]
        if spends and item.attempt >= binding.max_attempts:
            deads.append(Dead(item.id, wire.MAX_ATTEMPTS, error))
            return "dead_letter"
        after = outcome["after_s"]
        if after is None:
            after = ladder_delay(item.attempt, binding.retry_ladder_s)
        nacks.append(Nack(item.id, after, spend_attempt=spends, error=error))
        return "retry"

    def confirm(self) -> None:
        """Nothing: :meth:`hand_off`'s transaction was committed (durable) when it returned."""

    def checkpoint(self, batch: Batch, sync: bool) -> None:
        """Nothing: the acks are the checkpoint, written by :meth:`hand_off`."""

    def checkpoint_final(self, scope: Any) -> None:
        """Nothing more to write."""

    def counted(self, batch: Batch) -> None:
        """Batch and outcome metrics."""
        metrics.count_batch(COMPONENT, self.binding.name)
        metrics.record_outcomes(self.binding.name, self.binding.tenant, batch.counts)
        self.stats.update(batch.counts)


class QueueTailer:
    """Leases one binding's queue topic and runs it on the pipeline. ``queue`` defaults to
    the configured shards (``[queue] shards``)."""

    def __init__(self, settings: Settings, binding: Binding, client: SchedulerClient,
                 options: TailerOptions | None = None, *, queue: ShardedQueue | None = None,
                 hook: Hook = no_hook) -> None:
        self.settings = settings
        self.binding = binding
        self.client = client
        self.options = options or TailerOptions()
        self.hook = hook
        self._queue = queue
        self.source: QueueSource | None = None

    @property
    def stats(self) -> Counter[str]:
        """What became of the items so far (ok, retry, dead_letter)."""
        return self.source.stats if self.source is not None else Counter()

    def _source(self, queue: ShardedQueue, stop: threading.Event) -> QueueSource:
        """The source of this tailer."""
        return QueueSource(self.binding, queue, lease_owner(self.binding), stop)

    def run(self, stop: threading.Event) -> None:
        """Lease, run and resolve until ``stop`` is set; then finish what is under way."""
        own = self._queue is None
        queue = self._queue or ShardedQueue(self.settings.queue_shards)
        source = self._source(queue, stop)
        pipeline = Pipeline(source, self.client, COMPONENT, self.binding.name, self.options,
                            self.hook)
        source.pipeline = pipeline
        self.source = source
        log.info("tailer for binding %s started: queue topic %s (namespace %s), lease %gs",
                 self.binding.name, self.binding.topic, self.binding.tenant,
                 self.binding.lease_s)
        try:
            pipeline.run(stop)
        except SchedulerUnavailable:
            log.warning("binding %s: stopping with a batch unresolved; its items are leased "
                        "again once their leases run out", self.binding.name)
        finally:
            metrics.set_in_flight(COMPONENT, self.binding.name, 0)
            if own:
                queue.close()
            log.info("tailer for binding %s stopped", self.binding.name)

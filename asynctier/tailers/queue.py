"""The queue source: a binding's queue topic, leased a batch at a time.

A :class:`~asynctier.tailers.source.LeaseSource`: every queue binding is long work
(:mod:`asynctier.tailers.long_work`): each leased batch
goes to a scheduler on a run stream, and this module resolves each outcome the queue's
way as it comes: ok -> ack, retry(after) -> nack, available again after the delay (the
binding's ladder, or ``Retry(after=)`` exactly: the queue needs no hops), failed or out of
attempts -> a dead item with its reason. While an item runs, its lease is extended as its
scheduler reports it alive; when the reports stop (the scheduler or the tailer died), the
lease runs out and the item is leased again elsewhere.

Wake-up: an enqueue of ready items notifies its topic (:mod:`asynctier.queue.wakeups`),
and the tailer leases at once; otherwise a bounded poll: an empty lease is not asked again
for :data:`IDLE_POLL_S` (a lease query on an empty topic is cheap for PostgreSQL, ``make
bench-queue``), so an item whose notification was lost, or that became ready by its delay,
waits at most that long.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence

from asynctier.delay_streams.ladder import ladder_delay
from asynctier.platform import metrics, wire
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, HandoffError
from asynctier.platform.rpc import SchedulerClient
from asynctier.queue import wakeups
from asynctier.queue.items import Dead, Leased, Nack, item_ref
from asynctier.queue.shards import ShardedQueue
from asynctier.tailers.long_work import COMPONENT, LongWork
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import Hook, no_hook
from asynctier.tailers.source import Prepared

log = logging.getLogger(__name__)

#: Hex characters of the random part of a lease owner: tailers of one binding in one
#: process (a restart) never share an owner.
OWNER_RANDOM_CHARS = 8
#: How long an empty topic is left alone before it is leased from again.
IDLE_POLL_S = 0.1
#: How long a queue that could not be reached is left alone before the next lease.
DOWN_RETRY_S = 1.0
#: The queue being down is logged at most this often (it is tried every DOWN_RETRY_S).
DOWN_LOG_EVERY_S = 30.0


def source_ref(item: Leased) -> str:
    """The item's reference for the scheduler (run-once key, ``ctx.source``)."""
    return item_ref(item.namespace, item.topic, item.id)


def lease_owner(binding: Binding) -> str:
    """A lease owner name unique to this tailer: host, process, binding, a random part."""
    unique = uuid.uuid4().hex[:OWNER_RANDOM_CHARS]
    return f"{socket.gethostname()}:{os.getpid()}:{binding.name}:{unique}"


class QueueSource:
    """A binding's queue topic as a :class:`~asynctier.tailers.source.Source`."""

    def __init__(self, binding: Binding, queue: ShardedQueue, owner: str,
                 stop: threading.Event) -> None:
        self.binding = binding
        self.queue = queue
        self.owner = owner
        self.stop = stop
        self.what = f"binding {binding.name}"
        self.topic = binding.source.topic
        self.namespace = binding.tenant
        self.stats: Counter[str] = Counter()
        self._quiet_until = 0.0
        self._down_logged = 0.0
        route = queue.route_of(self.namespace, self.topic)
        self._wakeups = wakeups.acquire(route.name, lambda: route.store.dsn)
        self._woken = threading.Event()
        self._wakes: list[Callable[[], None]] = []
        self.on_ready(self._woken.set)

    def on_ready(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` too whenever an enqueue makes items of the topic ready: a loop
        that waits on something else than :meth:`read` wakes for them."""
        self._wakes.append(wake)
        self._wakeups.subscribe(self.namespace, self.topic, wake)

    def close(self) -> None:
        """Stop listening for this topic's wake-ups."""
        for wake in self._wakes:
            self._wakeups.unsubscribe(self.namespace, self.topic, wake)
        wakeups.release(self._wakeups)

    # -- reading --------------------------------------------------------------------------

    def read(self, max_records: int, wait_s: float) -> list[Leased]:
        """Lease up to ``max_records`` ready items; an empty topic is asked again when an
        enqueue wakes it, or after :data:`IDLE_POLL_S` (waiting at most ``wait_s`` here)."""
        now = time.monotonic()
        if now < self._quiet_until:
            woken = self._woken.wait(min(wait_s, self._quiet_until - now))
            if not woken and time.monotonic() < self._quiet_until:
                return []
        self._woken.clear()  # a wake-up from now on leases again
        try:
            leased = self.queue.lease(self.namespace, self.topic, max_records,
                                      self.binding.source.lease_s, self.owner,
                                      max_attempts=self.binding.retries.max_attempts)
        except AsynctierError as exc:
            self._unavailable(exc)
            self._quiet_until = time.monotonic() + DOWN_RETRY_S
            return []
        if not leased:
            self._quiet_until = time.monotonic() + IDLE_POLL_S
        metrics.count_lease_expiries(self.binding.name, self.namespace,
                                     sum(1 for item in leased if item.lease_ran_out))
        return leased

    def unavailable(self, exc: Exception) -> None:
        """Log (at most every :data:`DOWN_LOG_EVERY_S`) that the queue cannot be reached."""
        self._unavailable(exc)

    def _unavailable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._down_logged >= DOWN_LOG_EVERY_S:
            self._down_logged = now
            log.error("binding %s: cannot lease from queue topic %s (%s); trying again every "
                      "second", self.binding.name, self.topic, exc)

    def prepare(self, records: list[Leased]) -> Prepared[None]:
        """One call of the leased items (each keeps its priority)."""
        name = self.binding.name
        call = CallBuilder()
        for at, item in enumerate(records):
            if not call.add(name, item.payload, item.id.encode(), item.headers, item.attempt,
                            source_ref(item), item.enqueued_ms, item.priority):
                return Prepared(records[:at], call.encode(), None, rest=records[at:])
        return Prepared(records, call.encode() if records else None, None)

    # -- leases ---------------------------------------------------------------------------

    def extend(self, ids: list[str]) -> set[str]:
        """Extend the leases of ``ids`` by the binding's lease; those still held.
        AsynctierError when the queue cannot be reached."""
        return set(self.queue.extend_lease(self.namespace, self.topic, self.owner, ids,
                                           self.binding.source.lease_s))

    def save_checkpoint(self, item_id: str, state: bytes, kind: str) -> bool:
        """Store a checkpoint on the item's row, extending its lease; False when the lease
        is not held. AsynctierError when the queue cannot be reached."""
        return bool(self.queue.save_checkpoint(self.namespace, self.topic, self.owner,
                                               item_id, state, kind, self.binding.source.lease_s))

    # -- resolving ------------------------------------------------------------------------

    def resolve_items(self, pairs: Sequence[tuple[Leased, wire.Outcome]]) -> Counter[str]:
        """Acks, nacks and dead items of these (item, outcome) pairs, in one transaction
        (durable on return); what became of them, counted (ok, retry, dead_letter).
        Raises HandoffError when the queue refused or could not be reached."""
        counts: Counter[str] = Counter()
        acks: list[str] = []
        nacks: list[Nack] = []
        deads: list[Dead] = []
        for item, outcome in pairs:
            counts[self._resolution(item, outcome, acks, nacks, deads)] += 1
        try:
            self.queue.resolve(self.namespace, self.topic, self.owner, acks, nacks, deads)
        except AsynctierError as exc:
            raise HandoffError(f"queue topic {self.topic}: {exc}") from exc
        metrics.record_outcomes(self.binding.name, self.binding.tenant, counts)
        self.stats.update(counts)
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
        if spends and item.attempt >= binding.retries.max_attempts:
            deads.append(Dead(item.id, wire.MAX_ATTEMPTS, error))
            return "dead_letter"
        after = outcome["after_s"]
        if after is None:
            after = ladder_delay(item.attempt, binding.retries.ladder_s)
        nacks.append(Nack(item.id, after, spend_attempt=spends, error=error))
        return "retry"


class QueueTailer:
    """Leases one binding's queue topic and runs it as long work. ``queue`` defaults to
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
        self.source = source
        log.info("tailer for binding %s started: queue topic %s (namespace %s), lease %gs, "
                 "long work (outcomes streamed as items end)", self.binding.name,
                 self.binding.source.topic, self.binding.tenant, self.binding.source.lease_s)
        try:
            LongWork(source, self.client, self.options, self.hook).run(stop)
        finally:
            source.close()
            metrics.set_in_flight(COMPONENT, self.binding.name, 0)
            if own:
                queue.close()
            log.info("tailer for binding %s stopped", self.binding.name)

"""Long work on Kafka records: the records move into the queue, then run there with leases.

A Kafka binding whose timeout is above its ``--queue-after`` (60 s by default,
:attr:`Binding.moved_to_queue`) must not hold its partitions' commits for minutes. Its
tailer is two tailers in one:

* the **mover**, a Kafka tailer whose source is wrapped in :class:`MoverSource`, a
  strategy whose batches go to no scheduler: each
  record is enqueued (one transaction per batch) into the queue topic the platform owns for
  the binding (``<prefix>.moved.<binding>`` in the tenant's namespace), and only then are
  the offsets committed. The item's id is the record's ``topic/partition/offset``, so a
  record read again after a crash is enqueued once (the second enqueue is a no-op). A
  record too large for a queue item (1 MiB) is a dead letter (``too_large``) at once, in
  the binding's dead-letter topic.
* the **queue tailer** of that topic (:class:`~asynctier.tailers.queue.QueueTailer`): the
  items run under leases, extended while they run; retries are nacks along the ladder,
  and items out of attempts are dead items of that queue topic (``asynctier queue dead``,
  ``asynctier queue replay``). The function sees the record's key and its
  ``topic/partition/offset`` as ``ctx.source``, as on the Kafka path.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from asynctier.delay_streams.handoff import where
from asynctier.platform import metrics, names
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, HandoffError
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.supervise import Supervisor
from asynctier.platform.wire import TOO_LARGE, Outcome, failed, ok
from asynctier.queue.items import MAX_PAYLOAD_BYTES, Leased, NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.tailers.kafka import KafkaSource, KafkaTailer
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.partitions import sort_out
from asynctier.tailers.pipeline import Hook, no_hook
from asynctier.tailers.queue import QueueSource, QueueTailer, lease_owner
from asynctier.tailers.source import Around, Batch, OffsetSource, Prepared, high_marks

log = logging.getLogger(__name__)


def moved_item(topic: str, msg: Any) -> NewItem:
    """The queue item of one Kafka record: id ``topic/partition/offset``, its value, its
    headers (any ``asynctier.key`` of the producer's dropped) and its key in ``asynctier.key``."""
    headers = [(k, v) for k, v in msg.headers() or () if k != names.H_KEY]
    if msg.key() is not None:
        headers.append((names.H_KEY, msg.key()))
    return NewItem(topic, msg.value() or b"", id=where(msg), headers=headers)


class MoverSource(Around[None]):
    """A Kafka binding's topic whose records are enqueued, not run: no scheduler call."""

    def __init__(self, source: OffsetSource[Any], queue: ShardedQueue,
                 queue_topic: str) -> None:
        super().__init__(source)
        self.queue = queue
        self.queue_topic = queue_topic

    def prepare(self, records: list[Any]) -> Prepared[None]:
        """The records of owned partitions (consume errors are logged), as one batch that
        goes to no scheduler."""
        good, _ = sort_out(records, self.owned, self.what, self.topic)
        return Prepared(good, None, None, high_marks(good))

    def hand_off(self, batch: Batch[None]) -> Counter[str]:
        """Enqueue the batch's records in one transaction (durable when it returns); a
        record too large for a queue item is a dead letter. The moved records count as
        ``moved``, not ``ok``: the batch waits for its dead letters' confirm before its
        commit."""
        records = batch.records
        big = {at for at, msg in enumerate(records)
               if len(msg.value() or b"") > MAX_PAYLOAD_BYTES}
        items = [moved_item(self.queue_topic, msg) for at, msg in enumerate(records)
                 if at not in big]
        try:
            results = self.queue.enqueue(self.binding.tenant, items)
        except AsynctierError as exc:
            raise HandoffError(f"queue topic {self.binding.tenant}/{self.queue_topic}: "
                               f"{exc}") from exc
        again = sum(1 for r in results if not r.created)
        if again:
            log.info("binding %s: %d record(s) read again were in queue topic %s already",
                     self.binding.name, again, self.queue_topic)
        counts = self._dead_letters(records, big) if big else Counter()
        counts["ok"] = 0
        counts["moved"] = len(items)
        return +counts

    def _dead_letters(self, records: list[Any], big: set[int]) -> Counter[str]:
        outcomes: list[Outcome] = [
            failed(at, f"the record takes {len(msg.value() or b''):,} bytes, more than the "
                       f"{MAX_PAYLOAD_BYTES:,} a queue item holds: it cannot run as long "
                       "work (lower --timeout to --queue-after or below to run it from "
                       "Kafka)", TOO_LARGE)
            if at in big else ok(at) for at, msg in enumerate(records)]
        return self.handoff.resolve_messages(self.binding, records, outcomes)


class MovedQueueSource(QueueSource):
    """The moved records' queue topic: each item runs with its record's key and origin."""

    def prepare(self, records: list[Leased]) -> Prepared[None]:
        """One call of the leased items, keyed and referenced as their Kafka records."""
        name = self.binding.name
        call = CallBuilder()
        for at, item in enumerate(records):
            key, headers = _key_and_headers(item)
            if not call.add(name, item.payload, key, headers, item.attempt, item.id,
                            item.enqueued_ms, item.priority):
                return Prepared(records[:at], call.encode(), None, rest=records[at:])
        return Prepared(records, call.encode() if records else None, None)


def _key_and_headers(item: Leased) -> tuple[bytes | None, list[tuple[str, bytes | None]]]:
    key = None
    headers = []
    for name, value in item.headers:
        if name == names.H_KEY:
            key = value
        else:
            headers.append((name, value))
    return key, headers


class MovedQueueTailer(QueueTailer):
    """The queue tailer of a moved binding's queue topic."""

    def _source(self, queue: ShardedQueue, stop: threading.Event) -> QueueSource:
        return MovedQueueSource(self.binding, queue, lease_owner(self.binding), stop)


class MoverTailer(KafkaTailer):
    """The Kafka side of a moved binding: reads, enqueues, commits."""

    def __init__(self, settings: Settings, binding: Binding, client: SchedulerClient,
                 options: TailerOptions, queue: ShardedQueue, hook: Hook = no_hook) -> None:
        super().__init__(settings, binding, client, options, hook=hook)
        self.queue = queue

    def _around(self, source: KafkaSource) -> OffsetSource[Any]:
        return MoverSource(source, self.queue, self.settings.names.moved_topic(
            self.binding.name))


class MovedTailer:
    """A moved binding's two tailers (mover and queue tailer), each in its own thread;
    ``queue`` defaults to the configured shards (``[queue] shards``)."""

    def __init__(self, settings: Settings, binding: Binding, client: SchedulerClient,
                 options: TailerOptions | None = None, *, queue: ShardedQueue | None = None,
                 hook: Hook = no_hook) -> None:
        self.settings = settings
        self.binding = binding
        self.client = client
        self.options = options or TailerOptions()
        self.hook = hook
        self._queue = queue
        self.queue_topic = settings.names.moved_topic(binding.name)
        self.mover: MoverTailer | None = None
        self.runner: MovedQueueTailer | None = None

    def run(self, stop: threading.Event) -> None:
        """Run both until ``stop`` is set; each finishes what it has under way."""
        queue = self._queue or ShardedQueue(self.settings.queue_shards)
        b = self.binding
        self.mover = MoverTailer(self.settings, b, self.client, self.options, queue,
                                 self.hook)
        self.runner = MovedQueueTailer(self.settings, b.moved_binding(self.queue_topic),
                                       self.client, self.options, queue=queue, hook=self.hook)
        log.info("binding %s: timeout %gs is above --queue-after %gs: records of %s move "
                 "into queue topic %s/%s and run from there", b.name, b.execution.timeout_s,
                 b.source.queue_after_s, b.source.topic, b.tenant, self.queue_topic)
        # The queue tailer runs under its own supervisor (loop ``<binding>:queue``) until
        # this run of the mover ends, whatever ends it: the binding's supervisor then
        # starts both again.
        done = threading.Event()
        runner = Supervisor(f"{b.name}:queue", self.runner.run, done,
                            what=f"binding {b.name}: the tailer of queue topic "
                                 f"{self.queue_topic}",
                            hint="Its items wait in the queue, nothing is lost: items "
                                 "running are leased again once their leases run out. "
                                 "Check the queue's database and the error above.",
                            policy=self.settings.restarts,
                            on_restart=metrics.count_tailer_restart).start()
        try:
            self.mover.run(stop)
        finally:
            done.set()
            runner.join()
            if self._queue is None:
                queue.close()

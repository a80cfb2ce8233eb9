"""Where accepted workloads go: a queue binding's topic, or a Kafka binding's topic.

Both answer only once the write is durable: the queue's transaction committed, or every
record's delivery confirmed by the broker with ``acks=all``.

Queue writes are group-committed (:class:`GroupCommit`): the calls that arrive while a
namespace's writes are under way are written together by the next one, one statement and
one transaction per shard, and each is answered once that transaction committed.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, Producer

from asynctier.platform import metrics
from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError, QueueError
from asynctier.platform.kafka import client_config
from asynctier.platform.supervise import Supervisor
from asynctier.queue.items import EnqueueResult, NewItem, check_namespace
from asynctier.submitter.protocol import Workload

#: The Submitter's producer: every record acknowledged by all in-sync replicas, no
#: duplicates from the producer's own retries.
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 2,
    "compression.type": "lz4",
}


#: How long one poll for delivery reports waits (the stop is seen within it).
POLL_S = 0.05


class KafkaWriter:
    """Produces workloads and waits for each record's delivery report (topic, partition,
    offset). One producer per process; a supervised thread serves its delivery reports
    (were it to die, every Kafka write would wait for a report that never comes)."""

    def __init__(self, settings: Settings) -> None:
        self._producer = Producer({**client_config(settings), **PRODUCER_CONFIG})
        self._stop = threading.Event()
        self._poller = Supervisor(
            "submitter-producer", self._poll, self._stop,
            what="the Submitter's Kafka delivery reports",
            hint="Kafka writes wait for their reports meanwhile; check the error above.",
            on_restart=metrics.count_task_restart).start()

    def _poll(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._producer.poll(POLL_S)

    async def write(self, topic: str, workloads: Sequence[Workload]
                    ) -> list[tuple[int, int]]:
        """Produce ``workloads`` to ``topic``; (partition, offset) of each once every one
        is delivered. Raises HandoffError when any delivery failed."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[tuple[int, int]]] = []
        for w in workloads:
            future: asyncio.Future[tuple[int, int]] = loop.create_future()
            futures.append(future)
            self._produce(topic, w, _reporter(loop, future))
        results = await asyncio.gather(*futures, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise HandoffError(f"{len(errors)} of {len(results)} record(s) to {topic} were not "
                               f"delivered: {errors[0]}")
        return [r for r in results if not isinstance(r, BaseException)]

    def _produce(self, topic: str, w: Workload, report: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, w.payload, w.key, headers=list(w.headers) or None,
                                       on_delivery=report)
                return
            except BufferError:  # the client's queue is full: the poll thread drains it
                self._stop.wait(0.01)

    def close(self) -> None:
        """Deliver what is left (10 s at most) and stop."""
        self._producer.flush(10.0)
        self._stop.set()
        self._poller.join(5.0)


def _reporter(loop: asyncio.AbstractEventLoop, future: asyncio.Future[tuple[int, int]]
              ) -> Any:
    def report(err: KafkaError | None, msg: Any) -> None:
        if loop.is_closed():  # the caller's loop is gone: nobody waits for this report
            return
        if err is not None:
            loop.call_soon_threadsafe(_fail, future, HandoffError(err.str()))
        else:
            loop.call_soon_threadsafe(_done, future, (msg.partition(), msg.offset()))

    return report


def _done(future: asyncio.Future[tuple[int, int]], value: tuple[int, int]) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[tuple[int, int]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class ShardWriter(Protocol):
    """What the Submitter needs of one queue shard (a QueueStore)."""

    name: str

    def enqueue(self, namespace: str, items: Sequence[NewItem]) -> list[EnqueueResult]:
        """Enqueue in one transaction; one result (``id``, ``created``) per item."""
        ...


class QueueWriter(Protocol):
    """What the Submitter needs of the queue (a ShardedQueue)."""

    def route_of(self, namespace: str, topic: str) -> ShardWriter:
        """The shard that holds ``topic`` of ``namespace`` (its route: it follows a
        failover)."""
        ...


@dataclass
class _Lane:
    """The waiting writes of one namespace on one shard, and its flushes under way."""

    store: ShardWriter
    waiting: deque[tuple[list[NewItem], asyncio.Future[list[EnqueueResult]]]] = field(
        default_factory=deque)
    flushing: int = 0


class GroupCommit:
    """Concurrent enqueues of one namespace to one shard written together.

    A write that finds fewer than ``flushes`` writes of its namespace and shard under way
    starts at once (no waiting when the Submitter is idle); the others wait for the next
    free flush, which takes every waiting write (up to ``max_rows`` items) into one
    :meth:`ShardWriter.enqueue` call: one statement, one transaction. Each write is
    answered with its own results once that transaction committed, or with its error: a
    write is never answered accepted before it is stored. When the store refuses a group
    for a bad item (:class:`QueueError`, raised before anything is written), each of its
    writes is tried alone, so that one write's bad item never refuses its neighbours.
    """

    def __init__(self, queue: QueueWriter, *, flushes: int = 2, max_rows: int = 5_000
                 ) -> None:
        self.queue = queue
        self.flushes = flushes
        self.max_rows = max_rows
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Store calls made and items they carried (what the coalescing saved).
        self.calls = 0
        self.items = 0

    async def enqueue(self, namespace: str, topic: str, items: list[NewItem]
                      ) -> list[EnqueueResult]:
        """Enqueue ``items`` (of ``topic``) once stored, possibly together with others;
        one result (``id``, ``created``) per item."""
        check_namespace(namespace)
        if not items:
            return []
        future: asyncio.Future[list[EnqueueResult]] = (
            asyncio.get_running_loop().create_future())
        store = self.queue.route_of(namespace, topic)
        key = (store.name, namespace)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(store)
        lane.waiting.append((items, future))
        if lane.flushing < self.flushes:
            lane.flushing += 1
            task = asyncio.create_task(self._flush(key, lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _flush(self, key: tuple[str, str], lane: _Lane) -> None:
        try:
            while lane.waiting:
                taken = [lane.waiting.popleft()]
                rows = len(taken[0][0])
                while lane.waiting and rows + len(lane.waiting[0][0]) <= self.max_rows:
                    rows += len(lane.waiting[0][0])
                    taken.append(lane.waiting.popleft())
                await self._write(lane.store, key[1], taken)
        finally:
            lane.flushing -= 1
            if not lane.flushing:  # the lane is empty, unless this flush was cancelled
                while lane.waiting:
                    lane.waiting.popleft()[1].cancel()
                self._lanes.pop(key, None)

    async def _write(self, store: ShardWriter, namespace: str,
                     taken: list[tuple[list[NewItem], asyncio.Future[list[EnqueueResult]]]]
                     ) -> None:
        combined = [item for items, _ in taken for item in items]
        self.calls += 1
        self.items += len(combined)
        try:
            results = await asyncio.to_thread(store.enqueue, namespace, combined)
        except QueueError as exc:
            if len(taken) == 1:
                _fail_all(taken, exc)
                return
            for one in taken:  # a bad item: nothing was written; each write on its own
                await self._write(store, namespace, [one])
            return
        except asyncio.CancelledError:  # the Submitter stops: its callers are cancelled too
            for _, future in taken:
                future.cancel()
            raise
        except Exception as exc:
            _fail_all(taken, exc)
            return
        at = 0
        for items, future in taken:
            if not future.done():  # a cancelled call: its items are written all the same
                future.set_result(results[at:at + len(items)])
            at += len(items)


def _fail_all(taken: list[tuple[list[NewItem], asyncio.Future[list[EnqueueResult]]]],
              exc: BaseException) -> None:
    for _, future in taken:
        if not future.done():
            future.set_exception(exc)

"""The backlog of each queue binding: what ``asynctier lag`` shows beside Kafka lag, and
what :class:`QueueDepthCollector` exports as ``asynctier_queue_items`` and
``asynctier_queue_oldest_ready_seconds``.

A row is one binding's topic (``QueueStore.counts``): ready, delayed, leased and dead items
and the age of the oldest ready item. When the topic's shard does not answer, the row
carries the error instead of counts (and the other shards' rows are still read): a
PostgreSQL that is down is something to show, not a reason to fail the command.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError
from asynctier.queue.items import TopicCounts
from asynctier.queue.shards import ShardedQueue

log = logging.getLogger(__name__)

#: How long a backlog read waits for a shard before it says the shard is down.
READ_TIMEOUT_S = 3.0
#: The share of its time the depth collector may spend counting: counting a topic reads
#: each of its items, so a pass that took longer than this share of its interval (a topic
#: of millions) stretches the wait after it.
MAX_COUNTING_SHARE = 0.02


def wait_after(took_s: float, interval_s: float) -> float:
    """The wait after a pass that took ``took_s``: ``interval_s``, or longer so that
    counting takes at most :data:`MAX_COUNTING_SHARE` of the time."""
    return max(interval_s, took_s / MAX_COUNTING_SHARE - took_s)


@dataclass(frozen=True)
class BacklogRow:
    """One queue binding's backlog; the counts are None and ``error`` says why when its
    shard could not be read."""

    name: str
    namespace: str
    topic: str
    shard: str
    ready: int | None = None
    delayed: int | None = None
    leased: int | None = None
    dead: int | None = None
    oldest_ready_age_s: float | None = None
    error: str | None = None
    kind: str = "queue"
    waiting: int | None = None  # waiting for their parents (queue/deps.py)

    def as_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready values."""
        return asdict(self)


def queue_bindings(bindings: Iterable[Binding]) -> list[Binding]:
    """The bindings whose source is a queue topic, in name order."""
    return sorted((b for b in bindings if b.source.kind == "queue"), key=lambda b: b.name)


def open_queue(settings: Settings) -> ShardedQueue:
    """The configured shards, with small pools and a short wait: for reading backlog."""
    return ShardedQueue(settings.queue_shards, pool_size=1, timeout_s=READ_TIMEOUT_S)


def read_backlog(queue: ShardedQueue, bindings: Iterable[Binding]) -> list[BacklogRow]:
    """One row per queue binding of ``bindings``. A shard that fails is asked once: its
    other bindings' rows carry the same error."""
    rows = []
    down: dict[str, str] = {}
    for binding in queue_bindings(bindings):
        store = queue.shard_of(binding.tenant, binding.source.topic)
        error = down.get(store.name)
        counts: list[TopicCounts] = []
        if error is None:
            try:
                counts = queue.counts(binding.tenant, binding.source.topic)  # follows a failover
            except AsynctierError as exc:
                error = down[store.name] = str(exc)
        if error is not None:
            rows.append(BacklogRow(binding.name, binding.tenant, binding.source.topic, store.name,
                                   error=error))
            continue
        c = counts[0] if counts else TopicCounts(binding.tenant, binding.source.topic)
        rows.append(BacklogRow(binding.name, binding.tenant, binding.source.topic, store.name,
                               c.ready, c.delayed, c.leased, c.dead,
                               round(c.oldest_ready_age_s, 3), waiting=c.waiting))
    return rows


Series = tuple[str, str]  # (binding, tenant)


def export_backlog(rows: Iterable[BacklogRow]) -> set[Series]:
    """Set the depth gauges from the rows that were read; return their series."""
    series: set[Series] = set()
    for row in rows:
        if row.error is not None:
            continue
        states = {"ready": row.ready or 0, "delayed": row.delayed or 0,
                  "leased": row.leased or 0, "dead": row.dead or 0,
                  "waiting": row.waiting or 0}
        metrics.set_queue_items(row.name, row.namespace, states, row.oldest_ready_age_s or 0.0)
        series.add((row.name, row.namespace))
    return series


class QueueDepthCollector:
    """Keeps the queue depth gauges of one process's queue bindings fresh from a daemon
    thread, as :class:`~asynctier.platform.lag.LagCollector` does for Kafka lag.

    ``bindings`` is asked for the current bindings at each pass. The shards are opened at
    the first pass that has a queue binding (a process with Kafka bindings only never
    connects to PostgreSQL). Series of removed bindings, and of bindings whose shard does
    not answer, are dropped (a gap on the dashboard, not a stale number).
    """

    def __init__(self, settings: Settings, bindings: Callable[[], Mapping[str, Binding]],
                 *, interval_s: float = 15.0, queue: ShardedQueue | None = None) -> None:
        self.settings = settings
        self.bindings = bindings
        self.interval_s = interval_s
        self._queue = queue
        self._own = queue is None
        self._series: set[Series] = set()
        self._down: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self) -> list[BacklogRow]:
        """One pass: count, set the gauges, drop the series that went away."""
        wanted = queue_bindings(self.bindings().values())
        rows: list[BacklogRow] = []
        if wanted:
            if self._queue is None:
                self._queue = open_queue(self.settings)
            rows = read_backlog(self._queue, wanted)
        series = export_backlog(rows)
        for gone in self._series - series:
            metrics.forget_queue_items(*gone)
        self._series = series
        self._note_down(rows)
        return rows

    def _note_down(self, rows: list[BacklogRow]) -> None:
        down = {row.name for row in rows if row.error is not None}
        for row in rows:
            if row.name in down - self._down:
                log.warning("queue depth of binding %s not exported: %s", row.name, row.error)
        self._down = down

    def start(self) -> None:
        """Update now and then every ``interval_s`` in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="queue-depth", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        stretched = False
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.update()
            except Exception:  # a bad shard setting, for one; the next pass tries again
                log.warning("queue depth could not be read; will retry", exc_info=True)
            took = time.monotonic() - started
            wait = wait_after(took, self.interval_s)
            if (wait > self.interval_s) != stretched:
                stretched = not stretched
                log.info("queue depth: counting took %.2fs; the gauges are now read every "
                         "%.1fs (counting at most %d%% of the time)", took,
                         wait + took if stretched else self.interval_s,
                         round(MAX_COUNTING_SHARE * 100))
            self._stop.wait(wait)

    def stop(self) -> None:
        """Stop the thread and close the shards it opened."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 2 * READ_TIMEOUT_S)
        if self._own and self._queue is not None:
            self._queue.close()

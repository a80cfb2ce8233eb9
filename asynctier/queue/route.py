"""One shard's way to its primary: the host it talks to, and the move to another host
when that one fails.

A shard with one host is its :class:`QueueStore` and nothing more. A shard with standbys
(``postgresql://u@primary,standby/db``) asks every host what it is (:func:`probe`) before
its first operation and again after an operation fails for want of the server; it talks
to the writable host on the highest timeline (:func:`choose_primary`). A promoted standby
is on a higher timeline than the primary it replaced, so an old primary that comes back
is never chosen again by a process that has seen the promotion (and, fenced, by none).

While no host is writable (the primary lost, the standby not promoted yet) an operation
fails at once with QueueUnavailable, and the hosts are asked again at most every
:data:`PROBE_EVERY_S`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg

from asynctier.platform.errors import QueueUnavailable
from asynctier.queue.dsn import choose_primary, probe, redact_dsn, shard_hosts
from asynctier.queue.items import EnqueueResult, NewItem, new_item_id
from asynctier.queue.store import QueueStore

log = logging.getLogger(__name__)

T = TypeVar("T")
#: How often a shard whose primary is in doubt asks its hosts again.
PROBE_EVERY_S = 0.25
#: How long an operation on a shard with standbys waits for a connection to its host
#: before the hosts are asked who is primary (the operation then tries again).
HOST_TIMEOUT_S = 1.0


class ShardRoute:
    """The current :class:`QueueStore` of one shard, moved to the new primary by itself."""

    def __init__(self, dsn: str, pool_size: int = 4, timeout_s: float = 5.0) -> None:
        self.name = redact_dsn(dsn)
        hosts = shard_hosts(dsn)
        self.hosts = [dsn] if len(hosts) == 1 else hosts
        self._pool_size = pool_size
        self._timeout_s = timeout_s
        self._store = self._new_store(self.hosts[0])
        self._lock = threading.Lock()
        self._in_doubt = len(self.hosts) > 1  # which host is primary: ask before using
        self._probed_at = 0.0
        self._timeline = 0

    @property
    def store(self) -> QueueStore:
        """The store of the host believed to be the primary now."""
        if self._in_doubt:
            self._relocate(wait=False)
        return self._store

    def close(self) -> None:
        """Close the store's connections."""
        self._store.close()

    def call(self, op: Callable[[QueueStore], T]) -> T:
        """``op(store)`` on the primary. When it fails for want of the server, find the
        primary again and do ``op`` there (a moved primary at once; the same one again
        until the shard's timeout has passed), so ``op`` may run more than once."""
        if len(self.hosts) == 1:
            return op(self._store)
        deadline = time.monotonic() + self._timeout_s
        while True:
            store = self._current()
            try:
                return op(store)
            except (QueueUnavailable, psycopg.errors.ReadOnlySqlTransaction) as exc:
                with self._lock:
                    if self._store is store:
                        self._in_doubt = True
                        self._probed_at = 0.0
                moved = self._relocate(wait=True)
                if moved is None or (moved is store and time.monotonic() >= deadline):
                    if isinstance(exc, QueueUnavailable):
                        raise
                    raise QueueUnavailable(
                        f"queue shard {self.name}: its host {redact_dsn(store.dsn)} is "
                        "read-only (fenced after a failover) and no other host is "
                        "primary") from exc

    def enqueue(self, namespace: str, items: Sequence[NewItem]) -> list[EnqueueResult]:
        """:meth:`QueueStore.enqueue` on the primary, each item's id chosen first: an
        enqueue tried again after a failover (its commit may have landed) adds no item."""
        items = [i if i.id else dataclasses.replace(i, id=new_item_id()) for i in items]
        return self.call(lambda store: store.enqueue(namespace, items))

    def waiting(self, namespace: str, topic: str, cap: int) -> int:
        """:meth:`QueueStore.waiting` on the primary."""
        return self.call(lambda store: store.waiting(namespace, topic, cap))

    def _new_store(self, dsn: str) -> QueueStore:
        """A store on one host. With standbys, its wait for a connection is short
        (:data:`HOST_TIMEOUT_S`): :meth:`call` asks the hosts then, and waits on a live
        one until the shard's own timeout."""
        timeout = self._timeout_s if len(self.hosts) == 1 else min(self._timeout_s,
                                                                   HOST_TIMEOUT_S)
        return QueueStore(dsn, self._pool_size, timeout, name=self.name)

    def _current(self) -> QueueStore:
        if not self._in_doubt:
            return self._store
        store = self._relocate(wait=False)
        if store is None:
            raise QueueUnavailable(
                f"queue shard {self.name}: none of its hosts "
                f"({', '.join(redact_dsn(h) for h in self.hosts)}) is a writable primary; "
                "a failover promotes the standby (asynctier queue failover SHARD, or the "
                "--auto watcher); operations work again once one is")
        return store

    def _relocate(self, wait: bool) -> QueueStore | None:
        """Ask the hosts (not more often than every PROBE_EVERY_S unless ``wait``);
        the store of the primary, or None when none is writable."""
        with self._lock:
            if not self._in_doubt:
                return self._store
            if not wait and time.monotonic() - self._probed_at < PROBE_EVERY_S:
                return None
            self._probed_at = time.monotonic()
            chosen = choose_primary([probe(h) for h in self.hosts], self._timeline)
            if chosen is None:
                return None
            self._timeline = max(self._timeline, chosen.timeline or 0)
            self._in_doubt = False
            if chosen.dsn != self._store.dsn:
                self._move(chosen.dsn, chosen.timeline)
            return self._store

    def _move(self, dsn: str, timeline: int | None) -> None:
        old = self._store
        self._store = self._new_store(dsn)
        log.warning("queue shard %s: now on host %s (the primary, timeline %s); was on %s",
                    self.name, redact_dsn(dsn), timeline, redact_dsn(old.dsn))
        threading.Thread(target=old.close, name="queue-old-primary", daemon=True).start()

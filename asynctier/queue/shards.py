"""Sharding as FOQS does it: each (namespace, topic) lives on one PostgreSQL shard.

The shard is chosen by rendezvous (highest-random-weight) hashing of the topic's key with
each shard's name (its DSN without the password): adding a shard moves only the topics
that now score highest on it, and removing one moves only its own topics.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asynctier.platform.errors import ConfigError, QueueError
from asynctier.queue.items import (
    Dead,
    DeadItem,
    EnqueueResult,
    ItemInfo,
    Leased,
    Listed,
    Nack,
    NewItem,
    Resolved,
    Running,
    TopicCounts,
    check_namespace,
)
from asynctier.queue.route import ShardRoute
from asynctier.queue.store import DEFAULT_TIMEOUT_S, QueueStore

if TYPE_CHECKING:
    from asynctier.platform.config import Settings


def rendezvous(namespace: str, topic: str, shard_names: Sequence[str]) -> int:
    """The index of the shard whose hash with ``namespace/topic`` is highest."""
    def score(name: str) -> bytes:
        key = f"{name}\0{namespace}\0{topic}".encode()
        return hashlib.blake2b(key, digest_size=8).digest()

    return max(range(len(shard_names)), key=lambda i: score(shard_names[i]))


class ShardedQueue:
    """The queue over several shards, with :class:`QueueStore`'s API; each call goes to
    the shard of its (namespace, topic) (``enqueue`` splits its batch by shard)."""

    def __init__(self, dsns: Sequence[str], pool_size: int = 4,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not dsns:
            raise ConfigError("no queue shard is configured: set [queue] shards = "
                              '["postgresql://..."] or ASYNCTIER_QUEUE_SHARDS')
        self.routes = [ShardRoute(dsn, pool_size, timeout_s) for dsn in dsns]
        names = [route.name for route in self.routes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            for route in self.routes:
                route.close()
            raise ConfigError(f"queue shards {dup} are listed more than once: give each "
                              "database once")
        self._names = names

    @property
    def stores(self) -> list[QueueStore]:
        """Each shard's store on its primary now (a failover replaces it)."""
        return [route.store for route in self.routes]

    @classmethod
    def from_settings(cls, settings: Settings, pool_size: int = 4) -> ShardedQueue:
        """The shards of ``settings.queue_shards``."""
        return cls(settings.queue_shards, pool_size)

    def close(self) -> None:
        """Close every shard's connections."""
        for route in self.routes:
            route.close()

    def __enter__(self) -> ShardedQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def shard_of(self, namespace: str, topic: str) -> QueueStore:
        """The shard that holds ``topic`` of ``namespace`` (its store on its primary now;
        the methods of this class follow a failover, a store kept does not)."""
        return self.route_of(namespace, topic).store

    def route_of(self, namespace: str, topic: str) -> ShardRoute:
        """The route to the shard of ``topic`` of ``namespace``."""
        return self.routes[rendezvous(namespace, topic, self._names)]

    def enqueue(self, namespace: str, items: Sequence[NewItem]) -> list[EnqueueResult]:
        """:meth:`QueueStore.enqueue`, one statement per shard the batch touches; results
        in the batch's order."""
        check_namespace(namespace)
        by_shard: dict[int, list[int]] = {}
        for position, item in enumerate(items):
            index = rendezvous(namespace, item.topic, self._names)
            by_shard.setdefault(index, []).append(position)
            for parent_topic, parent_id in item.after:
                if rendezvous(namespace, parent_topic, self._names) != index:
                    raise QueueError(
                        f"item {position} of topic {item.topic!r}: its parent "
                        f"{parent_topic}/{parent_id} is on another queue shard; an item can "
                        "wait only for items of topics on its own shard (`asynctier queue "
                        "shards` shows where each topic lives)")
        results: list[EnqueueResult | None] = [None] * len(items)
        for index, positions in by_shard.items():
            done = self.routes[index].enqueue(namespace, [items[p] for p in positions])
            for position, result in zip(positions, done, strict=True):
                results[position] = result
        return [r for r in results if r is not None]

    def lease(self, namespace: str, topic: str, n: int, lease_s: float, owner: str,
              max_attempts: int | None = None) -> list[Leased]:
        """:meth:`QueueStore.lease` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.lease(namespace, topic, n, lease_s, owner, max_attempts))

    def resolve(self, namespace: str, topic: str, owner: str, acks: Sequence[str] = (),
                nacks: Sequence[Nack] = (), deads: Sequence[Dead] = ()) -> Resolved:
        """:meth:`QueueStore.resolve` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.resolve(namespace, topic, owner, acks, nacks, deads))

    def extend_lease(self, namespace: str, topic: str, owner: str, ids: Sequence[str],
                     lease_s: float) -> list[str]:
        """:meth:`QueueStore.extend_lease` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.extend_lease(namespace, topic, owner, ids, lease_s))

    def save_checkpoint(self, namespace: str, topic: str, owner: str, item_id: str,
                        state: bytes, kind: str, lease_s: float) -> bool:
        """:meth:`QueueStore.save_checkpoint` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.save_checkpoint(namespace, topic, owner, item_id, state, kind,
                                        lease_s))

    def running(self, namespace: str, topic: str | None = None,
                limit: int = 20) -> list[Running]:
        """:meth:`QueueStore.running`: of the topic's shard, or of every shard (the
        longest running first)."""
        if topic is not None:
            return self.route_of(namespace, topic).call(
                lambda s: s.running(namespace, topic, limit))
        found = [r for route in self.routes
                 for r in route.call(lambda s: s.running(namespace, None, limit))]
        return sorted(found, key=lambda r: -r.age_s)[:limit]

    def get(self, namespace: str, topic: str, item_id: str) -> ItemInfo | None:
        """:meth:`QueueStore.get` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.get(namespace, topic, item_id))

    def cancel(self, namespace: str, topic: str, item_id: str) -> bool:
        """:meth:`QueueStore.cancel` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.cancel(namespace, topic, item_id))

    def browse(self, namespace: str, topic: str, state: str, limit: int = 100,
               offset: int = 0) -> list[Listed]:
        """:meth:`QueueStore.browse` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.browse(namespace, topic, state, limit, offset))

    def run_now(self, namespace: str, topic: str, item_id: str) -> bool:
        """:meth:`QueueStore.run_now` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.run_now(namespace, topic, item_id))

    def counts(self, namespace: str, topic: str | None = None) -> list[TopicCounts]:
        """:meth:`QueueStore.counts`: of the topic's shard, or of every shard."""
        if topic is not None:
            return self.route_of(namespace, topic).call(
                lambda s: s.counts(namespace, topic))
        found = [c for route in self.routes for c in route.call(lambda s: s.counts(namespace))]
        return sorted(found, key=lambda c: c.topic)

    def dead_items(self, namespace: str, topic: str, limit: int = 100) -> list[DeadItem]:
        """:meth:`QueueStore.dead_items` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.dead_items(namespace, topic, limit))

    def replay(self, namespace: str, topic: str, limit: int | None = None,
               ids: Sequence[str] | None = None) -> int:
        """:meth:`QueueStore.replay` on the topic's shard."""
        return self.route_of(namespace, topic).call(
            lambda s: s.replay(namespace, topic, limit, ids))

    def topics(self) -> list[tuple[str, str]]:
        """Every (namespace, topic) any shard has had items for."""
        return sorted({t for route in self.routes for t in route.call(lambda s: s.topics())})

    def placement(self) -> list[tuple[str, str, str, list[str]]]:
        """(namespace, topic, the shard it hashes to, the shards that hold items of it)
        for every topic; a topic held elsewhere than where it hashes was placed before a
        shard was added or removed."""
        held: dict[tuple[str, str], list[str]] = {}
        for route in self.routes:
            for key in route.call(lambda s: s.topics()):
                held.setdefault(key, []).append(route.name)
        return [(ns, topic, self.shard_of(ns, topic).name, shards)
                for (ns, topic), shards in sorted(held.items())]

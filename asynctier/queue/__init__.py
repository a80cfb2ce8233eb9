"""The queue source: a FOQS-style priority queue with leases on PostgreSQL.

A queue topic belongs to a namespace (a binding's tenant). :class:`QueueStore` is one
shard (one database); :class:`ShardedQueue` routes each (namespace, topic) to a shard by
rendezvous hashing. The values they take and give are in :mod:`asynctier.queue.items`.
"""

from asynctier.queue.items import (
    MAX_PAYLOAD_BYTES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    Dead,
    DeadItem,
    EnqueueResult,
    ItemInfo,
    Leased,
    Nack,
    NewItem,
    Resolved,
    TopicCounts,
)
from asynctier.queue.store import QueueStore

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "Dead",
    "DeadItem",
    "EnqueueResult",
    "ItemInfo",
    "Leased",
    "Nack",
    "NewItem",
    "QueueStore",
    "Resolved",
    "TopicCounts",
]

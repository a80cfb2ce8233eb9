"""Redis clients from the platform's Redis URL: one server, or a Redis Cluster.

``redis://`` and ``rediss://`` (TLS) name one server. ``redis+cluster://host:port,...``
and ``rediss+cluster://host:port,...`` name a Redis Cluster by one or more of its nodes
(redis-py's ``RedisCluster`` finds the others and follows slot moves and failovers). Every
Lua script the platform runs names in ``KEYS[1]`` a key carrying the hash tag (``{...}``)
that all the keys it touches share, so each call runs on the one master of that slot.
"""

from __future__ import annotations

from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import ClusterDownError, RedisClusterException, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: A Redis client of either kind (asyncio).
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
#: A Redis client of either kind (blocking).
SyncRedis: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"

#: Errors that mean "Redis is not there" (refused, reset, timed out, still loading; on a
#: Redis Cluster also a slot without a master, as while a replica takes over).
REDIS_DOWN: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError,
                                               OSError, ClusterDownError, TryAgainError,
                                               RedisClusterException)

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return urlsplit(url).scheme in _CLUSTER_SCHEMES


def _cluster_parts(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A one-node URL redis-py's ``RedisCluster.from_url`` takes, and the other nodes."""
    parts = urlsplit(url)
    auth, _, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, port = host.strip().rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"Redis Cluster URL: {host!r} is not host:port; write "
                             "redis+cluster://host:port,host:port (redis.url)")
        nodes.append((name, int(port)))
    first = f"{nodes[0][0]}:{nodes[0][1]}"
    netloc = f"{auth}@{first}" if auth else first
    scheme = _CLUSTER_SCHEMES[parts.scheme]
    return urlunsplit((scheme, netloc, "", parts.query, "")), nodes[1:]


def async_client(url: str, **options: Any) -> AsyncRedis:
    """An asyncio client for ``url`` (a cluster client for a cluster URL)."""
    if not is_cluster_url(url):
        return redis.asyncio.Redis.from_url(url, **options)
    first, others = _cluster_parts(url)
    nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in others]
    return redis.asyncio.cluster.RedisCluster.from_url(
        first, startup_nodes=nodes or None, **_cluster_options(options))


def sync_client(url: str, **options: Any) -> SyncRedis:
    """A blocking client for ``url`` (a cluster client for a cluster URL)."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    first, others = _cluster_parts(url)
    nodes = [redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call]
             for h, p in others]
    return redis.cluster.RedisCluster.from_url(
        first, startup_nodes=nodes or None, **_cluster_options(options))


def _cluster_options(options: dict[str, Any]) -> dict[str, Any]:
    """The cluster client's options: the same timeouts; its own retries (it follows a
    failover by reading the slots again), so no ``retry`` from the one-server client."""
    return {k: v for k, v in options.items() if k != "retry"}

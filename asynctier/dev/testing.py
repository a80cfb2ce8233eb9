"""Test and benchmark support: services on free loopback ports in a temporary folder."""

from __future__ import annotations

import logging
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from asynctier.dev.jaeger import JaegerNode
from asynctier.dev.kafka import KafkaJars, KafkaNode
from asynctier.dev.postgres import PostgresNode, check_reachable, server_user
from asynctier.dev.process import TlsFiles, default_cache_dir, free_port
from asynctier.dev.redis import RedisNode
from asynctier.dev.redis_cluster import RedisClusterNodes
from asynctier.dev.registry import RegistryApp, RegistryNode
from asynctier.dev.replica import StandbyNode, make_synchronous, primary_settings
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- test harness


def start_test_kafka(root: Path, cache_dir: Path | None = None,
                     sasl_plain_users: dict[str, str] | None = None,
                     tls: TlsFiles | None = None) -> KafkaNode:
    """A Kafka node on free loopback ports with its data under ``root``, started
    (with a SASL/PLAIN listener when ``sasl_plain_users`` maps users to passwords, on TLS
    with ``tls``)."""
    jars = KafkaJars(cache_dir=cache_dir or default_cache_dir())
    return _started(lambda: KafkaNode(root / "kafka", free_port(), free_port(), jars=jars,
                                      sasl_plain_users=sasl_plain_users, tls=tls))


def start_test_redis(root: Path, password: str | None = None, tls: TlsFiles | None = None,
                     acl_users: dict[str, str] | None = None) -> RedisNode:
    """A Redis server on a free loopback port with its data under ``root``, started (TLS
    only with ``tls``; ACL users instead of the default user with ``acl_users``)."""
    return _started(lambda: RedisNode(root / "redis", free_port(), password, tls=tls,
                                      acl_users=acl_users))


def start_test_registry(root: Path, cache_dir: Path | None = None,
                        tls: TlsFiles | None = None) -> RegistryNode:
    """An Apicurio Registry on a free loopback port with its database under ``root``,
    started (HTTPS only with ``tls``)."""
    app = RegistryApp(cache_dir=cache_dir or default_cache_dir())
    return _started(lambda: RegistryNode(root / "registry", free_port(), free_port(),
                                         app=app, tls=tls))


def start_test_jaeger(root: Path) -> JaegerNode:
    """A Jaeger on free loopback ports under ``root``, started."""
    return _started(lambda: JaegerNode(root / "jaeger", free_port(), free_port(), free_port(),
                                       free_port()))


def start_test_redis_cluster(root: Path, replicas: int = 0) -> RedisClusterNodes:
    """A Redis Cluster of 3 masters (and ``replicas`` replicas each) on free loopback
    ports, started; each try in a folder of its own under ``root`` (a node's
    ``nodes.conf`` names its port)."""
    tries = iter(range(1, 100))
    return _started(lambda: RedisClusterNodes(root / f"try-{next(tries)}", replicas=replicas))


class _Node(Protocol):
    def start(self) -> bool: ...

    def stop(self, timeout_s: float = ...) -> bool: ...


NodeT = TypeVar("NodeT", bound=_Node)


def _started(make: Callable[[], NodeT], tries: int = 3) -> NodeT:
    """``make()``'s node, started; made again on other free ports when another process
    took a port between choosing it and binding it."""
    for attempt in range(tries):
        node = make()
        try:
            node.start()
            return node
        except ServiceError as exc:
            node.stop(5.0)
            if "already in use" not in str(exc) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def random_password() -> str:
    """A password for a test Redis."""
    return secrets.token_urlsafe(18)


def start_test_postgres(root: Path, password: str | None = None) -> PostgresNode:
    """A PostgreSQL server on a free loopback port with its data under ``root``, started.

    As root the server runs as an unprivileged user, who must be able to enter ``root``:
    when it cannot (pytest's temporary folders are 0700), the data goes to a folder of its
    own under the system's temporary folder instead (:func:`postgres_data_root`).
    """
    base = postgres_data_root(root)
    return _started(lambda: PostgresNode(base / "postgres", free_port(), password))


def start_test_postgres_pair(root: Path, password: str | None = None
                             ) -> tuple[PostgresNode, StandbyNode]:
    """A primary and its synchronous hot standby on free loopback ports, both started
    (:mod:`asynctier.dev.replica`); the shard's address is ``pair_dsn(primary, standby)``.
    The caller removes ``postgres_data_root(root)`` when it differs from ``root``."""
    base = postgres_data_root(root)
    primary = _started(lambda: PostgresNode(base / "primary", free_port(), password,
                                            settings=primary_settings()))
    try:
        standby = _started(lambda: StandbyNode(base / "standby", free_port(), password,
                                               primary=primary))
        make_synchronous(primary)
    except BaseException:
        primary.stop(5.0)
        raise
    return primary, standby


def postgres_data_root(root: Path) -> Path:
    """``root`` when the server's user can reach it, else a new 0755 folder under the
    system's temporary folder (the caller removes it)."""
    user = server_user()
    if user is None:
        return root
    try:
        check_reachable(root / "postgres", user)
        return root
    except ServiceError:
        folder = Path(tempfile.mkdtemp(prefix="asynctier-pg-"))
        folder.chmod(0o755)
        return folder

"""Test and benchmark support: services on free loopback ports in a temporary folder."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from asynctier.dev.kafka import KafkaJars, KafkaNode
from asynctier.dev.process import default_cache_dir, free_port
from asynctier.dev.redis import RedisNode
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)




# --------------------------------------------------------------------------- test harness


def start_test_kafka(root: Path, cache_dir: Path | None = None,
                     sasl_plain_users: dict[str, str] | None = None) -> KafkaNode:
    """A Kafka node on free loopback ports with its data under ``root``, started
    (with a SASL/PLAIN listener when ``sasl_plain_users`` maps users to passwords)."""
    jars = KafkaJars(cache_dir=cache_dir or default_cache_dir())
    for attempt in range(3):
        node = KafkaNode(root / "kafka", free_port(), free_port(), jars=jars,
                         sasl_plain_users=sasl_plain_users)
        try:
            node.start()
            return node
        except ServiceError as exc:
            node.stop(5.0)
            if "already in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def start_test_redis(root: Path, password: str | None = None) -> RedisNode:
    """A Redis server on a free loopback port with its data under ``root``, started."""
    for attempt in range(3):
        node = RedisNode(root / "redis", free_port(), password)
        try:
            node.start()
            return node
        except ServiceError as exc:
            node.stop(5.0)
            if "already in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def random_password() -> str:
    """A password for a test Redis."""
    return secrets.token_urlsafe(18)

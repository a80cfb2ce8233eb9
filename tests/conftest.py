"""Session fixtures: a real Kafka, a real Redis and a real PostgreSQL for the whole run.

Each starts on free loopback ports in a temporary folder through the same dev-stack code
as ``asynctier dev up``, unless ``ASYNCTIER_KAFKA_BOOTSTRAP`` / ``ASYNCTIER_REDIS_URL`` /
``ASYNCTIER_QUEUE_SHARDS`` (its first shard) point at running ones. When a service cannot
start under ``CI=true`` the tests that need it fail; elsewhere they are skipped with the
reason (shown by ``-ra``).

Every test gets its own prefix (so its own topics, groups and Redis keys). Tests marked
``slow`` run only with ``--long``; other long modes read ``request.config.getoption("--long")``.
"""

from __future__ import annotations

import os

# Before gRPC loads (the imports below load it): its fork handlers can crash a child that
# this process forks while gRPC's threads run, before the child's exec (a fork, not a
# vfork, whenever the child runs as another user: PostgreSQL's tools as user postgres).
# Nothing here forks a child that uses gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic

from asynctier import dev as devstack
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.queue import QueueStore
from tests.helpers import wait_until


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="run the long scenarios too (tests marked slow, long modes)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long scenario: run with --long")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def in_ci() -> bool:
    """True when running under CI (CI=true), where a missing service is a failure."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_unavailable(what: str, why: object) -> NoReturn:
    """Fail under CI, skip (with the reason) elsewhere."""
    message = f"{what} is not available: {why}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a running Kafka: ``$ASYNCTIER_KAFKA_BOOTSTRAP`` or our own."""
    given = os.environ.get("ASYNCTIER_KAFKA_BOOTSTRAP")
    if given:
        if not devstack.kafka_answers(given, timeout_s=15.0):
            service_unavailable("Kafka", f"ASYNCTIER_KAFKA_BOOTSTRAP={given} does not answer")
        yield given
        return
    try:
        node = devstack.start_test_kafka(tmp_path_factory.mktemp("stack"))
    except ServiceError as exc:
        service_unavailable("Kafka", exc)
    try:
        yield node.bootstrap
    finally:
        node.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a running Redis: ``$ASYNCTIER_REDIS_URL`` or our own."""
    given = os.environ.get("ASYNCTIER_REDIS_URL")
    if given:
        if not devstack.redis_answers(given, timeout_s=5.0):
            service_unavailable("Redis", f"ASYNCTIER_REDIS_URL={given} does not answer")
        yield given
        return
    try:
        node = devstack.start_test_redis(tmp_path_factory.mktemp("stack"))
    except ServiceError as exc:
        service_unavailable("Redis", exc)
    try:
        yield node.url
    finally:
        node.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devstack.RegistryNode]:
    """A running Apicurio Registry of our own (``.url``: its Confluent-compatible API)."""
    try:
        node = devstack.start_test_registry(tmp_path_factory.mktemp("stack"))
    except ServiceError as exc:
        service_unavailable("Apicurio Registry", exc)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devstack.JaegerNode]:
    """A running Jaeger of our own: spans over OTLP to ``.endpoint``, read back by
    ``.trace(id)``."""
    try:
        node = devstack.start_test_jaeger(tmp_path_factory.mktemp("stack"))
    except ServiceError as exc:
        service_unavailable("Jaeger", exc)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """DSN of a running PostgreSQL: the first of ``$ASYNCTIER_QUEUE_SHARDS`` or our own."""
    given = os.environ.get("ASYNCTIER_QUEUE_SHARDS")
    if given:
        dsn = given.split(",")[0].strip()
        if not devstack.postgres_answers(dsn, timeout_s=5.0):
            service_unavailable("PostgreSQL", f"ASYNCTIER_QUEUE_SHARDS={dsn} does not answer")
        yield dsn
        return
    root = tmp_path_factory.mktemp("stack")
    try:
        node = devstack.start_test_postgres(root)
    except ServiceError as exc:
        service_unavailable("PostgreSQL", exc)
    try:
        yield node.dsn
    finally:
        node.stop()
        if not node.data_dir.is_relative_to(root):  # its own folder (see start_test_postgres)
            shutil.rmtree(node.data_dir.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def queue_store(postgres: str) -> Iterator[QueueStore]:
    """A QueueStore on the session's PostgreSQL (tests isolate by ``queue_namespace``)."""
    store = QueueStore(postgres, pool_size=8)
    store.migrate()
    yield store
    store.close()


@pytest.fixture
def queue_namespace(prefix: str) -> str:
    """A queue namespace no other test uses: its topics and items are its own."""
    return prefix


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    """An AdminClient on the session's Kafka."""
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def prefix() -> str:
    """A prefix no other test uses: its topics, groups and keys are its own."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, prefix: str) -> Settings:
    """Settings pointing at the session's Kafka and Redis, under this test's prefix."""
    return Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                    prefix=prefix)


@pytest.fixture
def unique_group(prefix: str) -> str:
    """A consumer group no other test uses."""
    return f"{prefix}.group"


@pytest.fixture
def unique_topic(kafka_admin: AdminClient, prefix: str) -> Iterator[Callable[..., str]]:
    """A factory: ``unique_topic(partitions=1, config=None) -> name`` creates a topic that
    no other test uses and waits until its metadata shows every partition; the topics are
    deleted after the test."""
    created: list[str] = []

    def make(partitions: int = 1, config: dict[str, str] | None = None,
             name: str | None = None) -> str:
        topic = name or f"{prefix}.topic{len(created)}"
        new = NewTopic(topic, num_partitions=partitions, replication_factor=1,
                       config=config or {})
        kafka_admin.create_topics([new], operation_timeout=30)[topic].result(timeout=30)
        created.append(topic)
        wait_until(lambda: _partitions(kafka_admin, topic) == partitions, 30,
                   f"topic {topic} with {partitions} partitions in the metadata")
        return topic

    yield make
    if created:
        kafka_admin.delete_topics(created, operation_timeout=0)


def _partitions(admin: AdminClient, topic: str) -> int:
    meta: Any = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
    if meta is None or meta.error is not None:
        return 0
    return len(meta.partitions)


@pytest.fixture
def redis_client(redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    """A Redis client; the test's keys (``<prefix>:*``) are deleted afterwards."""
    client = redis.Redis.from_url(redis_url)
    yield client
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()

"""The services go away under load: the broker restarted mid-run, Redis stopped and started.

These scenarios start their OWN Kafka or Redis (``start_test_kafka`` / ``start_test_redis``
in the test's folder): the shared ones are never stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from asynctier import dev as devstack
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.kafka import admin, ensure_topics
from tests.faults.checker import Report
from tests.faults.harness import (
    FaultPlatform,
    make_docs,
    on_progress,
    produce,
    report,
    wait_resolved,
)
from tests.helpers import wait_until

LADDER = (1.0, 2.0)
ARGS = ("--retry-ladder", "1s,2s", "--max-attempts", "3")
BATCH = 500
IN_FLIGHT = 2


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[devstack.KafkaNode]:
    """A Kafka of this test only."""
    try:
        node = devstack.start_test_kafka(tmp_path / "own")
    except ServiceError as exc:
        pytest.fail(f"could not start a Kafka of the test's own: {exc}")
    yield node
    node.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[devstack.RedisNode]:
    """A Redis of this test only."""
    node = devstack.start_test_redis(tmp_path / "own")
    yield node
    node.stop()


def _topic(settings: Settings, name: str, partitions: int = 4) -> str:
    topic = f"{settings.prefix}.{name}"
    ensure_topics(admin(settings), {topic: (partitions, {})})
    return topic


def _run(plat: FaultPlatform, settings: Settings, records: int) -> range:
    topic = _topic(settings, "orders")
    ids = range(records)
    produce(settings, topic, make_docs(records, failing_every=50,
                                       extra={i: {"sleep": 0.0003} for i in range(records)}))
    plat.bind("orders", topic, *ARGS)
    plat.start("scheduler")
    plat.start("delay")
    plat.start("tailers", None, "--batch-size", str(BATCH))
    return ids


def test_broker_restarted_mid_run(own_kafka: devstack.KafkaNode, redis_url: str, prefix: str,
                                  tmp_path: Path, records: int,
                                  fault_results: list[Report]) -> None:
    settings = Settings(kafka={"bootstrap.servers": own_kafka.bootstrap}, redis_url=redis_url,
                        prefix=prefix)
    plat = FaultPlatform(settings, tmp_path)
    try:
        ids = _run(plat, settings, records)
        on_progress(plat, records // 4)()
        own_kafka.restart()
        wait_resolved(plat, ids, 240)
        assert all(plat.alive(n) for n in ("scheduler", "delay", "tailers"))
        result = report(plat, "broker restarted mid-run", "orders", ids, LADDER,
                        2 * IN_FLIGHT * BATCH, fault_results)
    finally:
        plat.stop_all()
    assert result.ok, result.summary()


def test_redis_stopped_and_started_mid_run(own_redis: devstack.RedisNode, kafka_bootstrap: str,
                                           prefix: str, tmp_path: Path, records: int,
                                           fault_results: list[Report]) -> None:
    settings = Settings(kafka={"bootstrap.servers": kafka_bootstrap},
                        redis_url=own_redis.url, prefix=prefix)
    plat = FaultPlatform(settings, tmp_path)
    try:
        ids = _run(plat, settings, records)
        on_progress(plat, records // 4)()
        own_redis.stop()
        count = len(plat.calls())
        wait_until(lambda: len(plat.calls()) >= count + records // 10, 60,
                   "records keep flowing while Redis is down")
        own_redis.start()
        wait_resolved(plat, ids, 240)
        assert all(plat.alive(n) for n in ("scheduler", "delay", "tailers"))
        result = report(plat, "Redis stopped and started", "orders", ids, LADDER,
                        IN_FLIGHT * BATCH, fault_results)
    finally:
        plat.stop_all()
    assert result.ok, result.summary()

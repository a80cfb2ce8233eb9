"""The platform on clusters, with a node lost mid-run: a Redis Cluster master killed and
failed over to its replica, a Kafka broker of three SIGKILLed mid-drain and brought back.

Both start their OWN cluster in the test's folder. The broker loss runs in the default run
(a 3-broker Kafka starts in about 15 s on an idle machine, minutes on a loaded one); the
Redis Cluster failover is ``--long``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from asynctier.dev.kafka import KafkaJars
from asynctier.dev.kafka_cluster import KafkaCluster
from asynctier.dev.process import default_cache_dir
from asynctier.dev.redis_cluster import RedisClusterNodes
from asynctier.dev.testing import start_test_redis_cluster
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.kafka import admin, ensure_topics, topic_replication
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
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterNodes]:
    """3 masters and 3 replicas of this test only."""
    try:
        nodes = start_test_redis_cluster(tmp_path / "rcluster", replicas=1)
    except ServiceError as exc:
        pytest.fail(f"could not start a Redis Cluster: {exc}")
    yield nodes
    nodes.stop(5.0)


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """3 Kafka brokers of this test only."""
    nodes = KafkaCluster(tmp_path / "kcluster", jars=KafkaJars(cache_dir=default_cache_dir()))
    try:
        nodes.start()
    except ServiceError as exc:
        nodes.stop(5.0)
        pytest.fail(f"could not start a 3-broker Kafka: {exc}")
    yield nodes
    nodes.stop(10.0)


def _run(plat: FaultPlatform, settings: Settings, records: int) -> range:
    topic = f"{settings.prefix}.orders"
    ensure_topics(admin(settings), {topic: (4, {})},
                  replication=topic_replication(settings))
    ids = range(records)
    docs = make_docs(records, failing_every=50,
                     extra={i: {"sleep": 0.0003} for i in range(records)})
    for start in range(0, records, 5_000):  # each confirmed within the harness' 60 s
        produce(settings, topic, docs[start:start + 5_000])
    plat.bind("orders", topic, *ARGS)
    plat.start("scheduler")
    plat.start("delay")
    plat.start("tailers", None, "--batch-size", str(BATCH))
    return ids


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a cluster start is minutes on a loaded machine
def test_redis_cluster_master_failed_over_mid_run(
        redis_cluster: RedisClusterNodes, kafka_bootstrap: str, prefix: str, tmp_path: Path,
        records: int, fault_results: list[Report]) -> None:
    settings = Settings(kafka={"bootstrap.servers": kafka_bootstrap},
                        redis_url=redis_cluster.url, prefix=prefix)
    plat = FaultPlatform(settings, tmp_path)
    try:
        ids = _run(plat, settings, records)
        on_progress(plat, records // 4)()
        victim = redis_cluster.master_of(settings.names.once_key("orders", "1"))
        victim.kill()  # the master of the binding's run-once state
        redis_cluster.wait_ok()  # its replica took over
        wait_resolved(plat, ids, 300)
        assert all(plat.alive(n) for n in ("scheduler", "delay", "tailers"))
        result = report(plat, "Redis Cluster master killed, failed over", "orders", ids,
                        LADDER, 2 * IN_FLIGHT * BATCH, fault_results)
    finally:
        plat.stop_all()
    assert result.ok, result.summary()


@pytest.mark.timeout(1800)
def test_kafka_broker_sigkilled_mid_drain_and_brought_back(
        kafka_cluster: KafkaCluster, redis_url: str, prefix: str, tmp_path: Path,
        records: int, fault_results: list[Report]) -> None:
    settings = Settings(kafka={"bootstrap.servers": kafka_cluster.bootstrap},
                        redis_url=redis_url, prefix=prefix)
    records = min(records, 20_000)  # 3 brokers and the platform on 2 cores: 20,000 even --long
    plat = FaultPlatform(settings, tmp_path)
    try:
        ids = _run(plat, settings, records)
        on_progress(plat, records // 4)()
        _assert_replicated(settings, [f"{prefix}.orders", settings.names.delay_topic("1s"),
                                      settings.names.dlq_topic("orders")])
        victim = kafka_cluster.nodes[0]
        victim.kill()
        count = len(plat.calls())
        wait_until(lambda: len(plat.calls()) >= count + records // 10, 120,
                   "records keep flowing with one broker of three down")
        victim.launch()  # a broker catching up on a loaded machine: minutes, not 90 s
        wait_until(victim.healthy, 600, "the restarted broker answers", interval=1.0)
        wait_resolved(plat, ids, 300)
        assert all(plat.alive(n) for n in ("scheduler", "delay", "tailers"))
        result = report(plat, "Kafka broker of 3 SIGKILLed mid-drain", "orders", ids,
                        LADDER, 2 * IN_FLIGHT * BATCH, fault_results)
    finally:
        plat.stop_all()
    assert result.ok, result.summary()


def _assert_replicated(settings: Settings, topics: list[str]) -> None:
    """Each topic has 3 replicas per partition and ``min.insync.replicas=2``."""
    client = admin(settings)
    meta = client.list_topics(timeout=30).topics
    for topic in topics:
        assert {len(p.replicas) for p in meta[topic].partitions.values()} == {3}, topic
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    for resource, future in client.describe_configs(resources).items():
        assert future.result()["min.insync.replicas"].value == "2", resource.name

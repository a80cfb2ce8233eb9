"""A topic just created shows in the metadata a moment after CreateTopics answers (the
controller has it; the broker learns it from the metadata log). What the platform creates
is usable when ``ensure_topics`` returns, and ``bind`` finds a topic that another client
created a moment before (real Kafka)."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewTopic

from asynctier.cli import main
from asynctier.platform.config import Settings
from asynctier.platform.kafka import ensure_topics
from asynctier.platform.registry import BindingRegistry


def _shown(admin: AdminClient, topic: str) -> int | None:
    meta: Any = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
    return None if meta is None or meta.error is not None else len(meta.partitions)


def test_topics_show_in_the_metadata_when_ensure_topics_returns(
        kafka_admin: AdminClient, prefix: str) -> None:
    for round_ in range(3):
        names = [f"{prefix}.made{round_}.{i}" for i in range(4)]
        assert sorted(ensure_topics(kafka_admin, {t: (8, {}) for t in names})) == sorted(names)
        # at once: no second look
        assert [_shown(kafka_admin, t) for t in names] == [8] * 4


def test_bind_finds_a_topic_another_client_created_a_moment_before(
        kafka_admin: AdminClient, settings: Settings, kafka_bootstrap: str, redis_url: str,
        prefix: str) -> None:
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": kafka_bootstrap, "ASYNCTIER_REDIS_URL": redis_url,
           "ASYNCTIER_PREFIX": prefix, "ASYNCTIER_ALLOW_MODULES": "tests"}
    for i in range(3):
        topic = f"{prefix}.theirs{i}"
        kafka_admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)],
                                  operation_timeout=30)[topic].result(timeout=30)
        result = CliRunner().invoke(main, ["bind", f"b{i}", "--topic", topic, "--function",
                                           "tests.funcs.ledger:record"], env=env)
        assert result.exit_code == 0, result.output
    assert sorted(BindingRegistry(settings).load()) == ["b0", "b1", "b2"]


def test_bind_still_refuses_a_topic_that_does_not_exist(
        kafka_bootstrap: str, redis_url: str, prefix: str) -> None:
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": kafka_bootstrap, "ASYNCTIER_REDIS_URL": redis_url,
           "ASYNCTIER_PREFIX": prefix, "ASYNCTIER_ALLOW_MODULES": "tests"}
    result = CliRunner().invoke(main, ["bind", "b", "--topic", f"{prefix}.none",
                                       "--function", "tests.funcs.ledger:record"], env=env)
    assert result.exit_code != 0
    assert "does not exist; create it first or pass --create-topic N" in result.output

"""Kafka's own command-line tools in the dev stack (``deploy/kafka/bin``, on PATH after
``asynctier dev env``), run against the session's broker: each Kafka command the docs and
the platform's messages tell an operator to run works as written, and the consumer-group
tool sees the lag ``asynctier lag`` reports."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from asynctier.cli import main
from asynctier.dev.stack import KAFKA_BIN
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str, *args: str) -> str:
    done = subprocess.run([str(KAFKA_BIN / name), *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, f"{name} {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _docs_command(name: str) -> str:
    """The ``name`` command line as the platform's warning spells it."""
    source = (REPO / "asynctier" / "platform" / "kafka.py").read_text()
    found = re.search(rf'"Raise it yourself: ({re.escape(name)} [^"]*)"\s*\n\s*"([^"]*)"',
                      source)
    assert found is not None, f"the {name} command is no longer in platform/kafka.py"
    return found.group(1) + found.group(2)


def _topic_config(admin: AdminClient, topic: str, key: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries: Any = admin.describe_configs([resource])[resource].result(30)
    return str(entries[key].value)


def test_kafka_configs_runs_as_the_warning_writes_it(
        kafka_admin: AdminClient, unique_topic: Callable[..., str],
        kafka_bootstrap: str) -> None:
    topic = unique_topic(1)
    line = _docs_command("kafka-configs.sh") % (topic, "max.message.bytes=67108864")
    argv = line.split()
    assert argv[:3] == ["kafka-configs.sh", "--alter", "--entity-type"]
    _tool(argv[0], "--bootstrap-server", kafka_bootstrap, *argv[1:])
    assert _topic_config(kafka_admin, topic, "max.message.bytes") == "67108864"


def test_kafka_reassign_partitions_executes_and_verifies(
        unique_topic: Callable[..., str], kafka_bootstrap: str, kafka_admin: AdminClient,
        tmp_path: Path) -> None:
    topic = unique_topic(2)
    broker = next(iter(kafka_admin.list_topics(timeout=10).brokers))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": p, "replicas": [broker]} for p in (0, 1)]}))
    common = ["--bootstrap-server", kafka_bootstrap, "--reassignment-json-file", str(plan)]
    assert "Successfully started partition reassignments" in _tool(
        "kafka-reassign-partitions.sh", *common, "--execute")
    assert f"Reassignment of partition {topic}-0 is completed" in _tool(
        "kafka-reassign-partitions.sh", *common, "--verify")


def test_consumer_groups_describe_shows_the_lag_asynctier_lag_shows(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(2)
    BindingRegistry(settings).put(Binding(name="orders", source=Source("kafka", topic),
                                          function="m:f"))
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(20):
        producer.produce(topic, b"{}", partition=i % 2)
    assert producer.flush(30) == 0
    group = settings.names.group("orders")
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 7), TopicPartition(topic, 1, 2)],
                    asynchronous=False)
    consumer.close()

    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_CONFIG": ""}
    result = CliRunner().invoke(main, ["lag", "--json", "--binding", "orders"], env=env)
    assert result.exit_code == 0, result.output
    ours = {r["partition"]: r["lag"] for r in json.loads(result.stdout)
            if r["kind"] == "binding"}

    out = _tool("kafka-consumer-groups.sh", "--bootstrap-server", settings.kafka_bootstrap,
                "--describe", "--group", group)
    theirs = {}
    for row in out.splitlines():
        cells = row.split()
        if len(cells) >= 6 and cells[0] == group and cells[1] == topic:
            theirs[int(cells[2])] = int(cells[5])  # GROUP TOPIC PARTITION CURRENT END LAG
    assert theirs == ours == {0: 3, 1: 8}

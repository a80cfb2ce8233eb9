"""Lag per binding and partition, read from a real broker with no platform running."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from asynctier.cli import main
from asynctier.cli.lag import format_age
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.lag import (
    LagCollector,
    LagReader,
    LagTarget,
    delay_intervals,
    read_lag,
    row_of,
    start_offset,
    targets_for,
)
from asynctier.platform.names import Names
from asynctier.platform.registry import BindingRegistry
from tests.helpers import wait_until

TARGET = LagTarget("binding", "orders", "p.orders", "src")

# --- pure logic -----------------------------------------------------------------------


@given(committed=st.one_of(st.none(), st.integers(0, 10_000)), low=st.integers(0, 10_000),
       extra=st.integers(0, 10_000))
def test_lag_counts_from_the_committed_offset_or_the_low_watermark(
        committed: int | None, low: int, extra: int) -> None:
    end = low + extra
    if committed is not None:
        committed = min(committed, end)
    row = row_of(TARGET, 0, committed, low, end, record_ms=1_000, now_s=11.0)
    assert row.lag == end - start_offset(committed, low)
    assert 0 <= row.lag <= end - low
    assert row.lag_seconds == (0.0 if row.lag == 0 else 10.0)


def test_lag_seconds_unknown_without_a_record_time() -> None:
    assert row_of(TARGET, 0, 0, 0, 5, None, 100.0).lag_seconds is None
    assert row_of(TARGET, 0, 5, 0, 5, None, 100.0).lag_seconds == 0.0


def test_delay_intervals_come_from_topic_names_shortest_first() -> None:
    names = Names("p")
    topics = ["p.delay.5m", "p.delay.30s", "p.delay.1m", "p.delay.junk", "q.delay.30s",
              "p.dlq.orders", "p.orders"]
    assert delay_intervals(names, topics) == ["30s", "1m", "5m"]


def test_targets_for_one_binding_keep_its_ladder_and_dead_letters() -> None:
    names = Names("p")
    a = Binding(name="a", source=Source("kafka", "ta"), function="m:f",
                retries=Retries(ladder_s=(30.0, 60.0)))
    b = Binding(name="b", source=Source("kafka", "tb"), function="m:f",
                retries=Retries(ladder_s=(300.0,)))
    topics = ["ta", "tb", "p.delay.30s", "p.delay.1m", "p.delay.5m", "p.dlq.a"]
    every = targets_for(names, [a, b], topics)
    assert [(t.kind, t.name) for t in every] == [
        ("binding", "a"), ("binding", "b"), ("delay", "30s"), ("delay", "1m"),
        ("delay", "5m"), ("dlq", "a")]  # no dlq row for b: its topic does not exist
    only_a = targets_for(names, [a, b], topics, only="a")
    assert [(t.kind, t.name, t.group) for t in only_a] == [
        ("binding", "a", "p.a"), ("delay", "30s", "p.delay.30s"),
        ("delay", "1m", "p.delay.1m"), ("dlq", "a", "p.dlq-replay.a")]


def test_format_age() -> None:
    assert [format_age(s) for s in (None, 0, 0.25, 4.25, 42, 312, 11_040)] == [
        "?", "0s", "250ms", "4.2s", "42s", "5m12s", "3h04m"]


# --- against the broker ---------------------------------------------------------------


def _produce(bootstrap: str, topic: str, n: int, partitions: int,
             timestamp_ms: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(topic, b"{}", partition=i % partitions, timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def _commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def _consume_all_and_commit(bootstrap: str, group: str, topic: str, partitions: int,
                            timeout_s: float = 30.0) -> None:
    """Read every partition to its end in ``group`` and commit, as a tailer would."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, "could not read the topic to its end"
            for msg in consumer.consume(100, 0.5):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(int(msg.partition() or 0))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def _rows_by_kind(rows: list[Any], kind: str) -> list[Any]:
    return [r for r in rows if r.kind == kind]


def _cli_lag(settings: Settings, *args: str) -> list[dict[str, Any]]:
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_CONFIG": ""}
    result = CliRunner().invoke(main, ["lag", "--json", *args], env=env)
    assert result.exit_code == 0, result.output
    out: list[dict[str, Any]] = json.loads(result.stdout)
    return out


def test_lag_json_shows_committed_end_lag_and_seconds_per_partition(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(partitions=3)
    BindingRegistry(settings).put(Binding(name="orders", source=Source("kafka", topic),
                                          function="m:f"))
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    _produce(settings.kafka_bootstrap, topic, 30, 3, timestamp_ms=hour_ago_ms)
    group = settings.names.group("orders")
    _commit(settings.kafka_bootstrap, group,
            [TopicPartition(topic, 0, 10), TopicPartition(topic, 1, 4)])

    rows = _cli_lag(settings)
    by_part = {r["partition"]: r for r in rows if r["kind"] == "binding"}
    assert {p: (r["committed"], r["end"], r["lag"]) for p, r in by_part.items()} == {
        0: (10, 10, 0), 1: (4, 10, 6), 2: (None, 10, 10)}
    assert all(r["group"] == group and r["topic"] == topic for r in by_part.values())
    assert by_part[0]["lag_seconds"] == 0
    for p in (1, 2):
        assert 3600 <= by_part[p]["lag_seconds"] < 3600 + 120


def test_lag_grows_with_production_and_shrinks_to_zero_once_committed(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(partitions=2)
    BindingRegistry(settings).put(Binding(name="clicks", source=Source("kafka", topic),
                                          function="m:f"))
    group = settings.names.group("clicks")

    def total() -> int:
        return sum(r["lag"] for r in _cli_lag(settings, "--binding", "clicks")
                   if r["kind"] == "binding")

    assert total() == 0
    _produce(settings.kafka_bootstrap, topic, 10, 2)
    assert total() == 10
    _produce(settings.kafka_bootstrap, topic, 6, 2)
    assert total() == 16
    _consume_all_and_commit(settings.kafka_bootstrap, group, topic, 2)
    rows = _cli_lag(settings, "--binding", "clicks")
    assert [(r["committed"], r["lag"], r["lag_seconds"]) for r in rows
            if r["kind"] == "binding"] == [(8, 0, 0), (8, 0, 0)]


def test_delay_and_dead_letter_topics_have_their_own_rows(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    names = settings.names
    source = unique_topic(partitions=1)
    delay = unique_topic(partitions=2, name=names.delay_topic("30s"))
    dlq = unique_topic(partitions=1, name=names.dlq_topic("pay"))
    BindingRegistry(settings).put(Binding(name="pay", source=Source("kafka", source),
                                          function="m:f", retries=Retries(ladder_s=(30.0, 60.0))))
    _produce(settings.kafka_bootstrap, delay, 5, 2)
    _produce(settings.kafka_bootstrap, dlq, 3, 1)
    _commit(settings.kafka_bootstrap, names.delay_group("30s"), [TopicPartition(delay, 0, 2)])

    rows = read_lag(settings, BindingRegistry(settings).load().values(), only="pay")
    delay_rows = _rows_by_kind(rows, "delay")
    assert [(r.name, r.group, r.partition, r.committed, r.end, r.lag) for r in delay_rows] == [
        ("30s", names.delay_group("30s"), 0, 2, 3, 1),
        ("30s", names.delay_group("30s"), 1, None, 2, 2)]
    (dead,) = _rows_by_kind(rows, "dlq")
    assert (dead.topic, dead.end, dead.lag) == (dlq, 3, 3)
    assert dead.lag_seconds is not None and dead.lag_seconds < 120


def test_two_groups_on_one_topic_each_get_their_own_age(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(partitions=1)
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for age_s in (600, 300, 60):
        producer.produce(topic, b"{}", timestamp=now_ms - age_s * 1000)
    assert producer.flush(30) == 0
    a = Binding(name="a", source=Source("kafka", topic), function="m:f")
    b = Binding(name="b", source=Source("kafka", topic), function="m:f")
    _commit(settings.kafka_bootstrap, settings.names.group("b"), [TopicPartition(topic, 0, 2)])
    reader = LagReader(settings)
    try:
        rows = read_lag(settings, [a, b], reader=reader)
        again = read_lag(settings, [a, b], reader=reader)  # served from the time cache
    finally:
        reader.close()
    ages = {r.name: r.lag_seconds or 0.0 for r in rows if r.kind == "binding"}
    assert 600 <= ages["a"] < 720 and 60 <= ages["b"] < 180
    assert [r.lag for r in again] == [r.lag for r in rows]


def test_collector_exports_gauges_and_drops_removed_bindings(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    names = settings.names
    topic = unique_topic(partitions=2)
    delay = unique_topic(partitions=1, name=names.delay_topic("1m"))
    _produce(settings.kafka_bootstrap, topic, 7, 2)
    _produce(settings.kafka_bootstrap, delay, 4, 1)
    bindings = {"c": Binding(name="c", source=Source("kafka", topic), function="m:f")}
    collector = LagCollector(settings, lambda: dict(bindings), delay=True, interval_s=0.2)
    collector.start()
    group = names.group("c")

    def lag_of(partition: int) -> float | None:
        return REGISTRY.get_sample_value("asynctier_consumer_lag", {
            "group": group, "topic": topic, "partition": str(partition)})

    try:
        wait_until(lambda: lag_of(0) == 4 and lag_of(1) == 3, 20, "lag of both partitions")
        backlog = wait_until(lambda: REGISTRY.get_sample_value(
            "asynctier_delay_backlog", {"topic": delay}), 20, "delay backlog")
        assert backlog == 4
        seconds = REGISTRY.get_sample_value("asynctier_consumer_lag_seconds", {
            "group": group, "topic": topic, "partition": "0"})
        assert seconds is not None and 0 <= seconds < 120
        bindings.clear()
        wait_until(lambda: lag_of(0) is None and lag_of(1) is None, 20,
                   "series of a removed binding dropped")
    finally:
        collector.stop()


def test_unknown_binding_is_a_clear_error(settings: Settings) -> None:
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_CONFIG": ""}
    result = CliRunner().invoke(main, ["lag", "--binding", "nope"], env=env)
    assert result.exit_code == 2
    assert "no binding named 'nope'" in result.output


@pytest.mark.parametrize("as_json", [False, True])
def test_lag_without_bindings(settings: Settings, as_json: bool) -> None:
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_CONFIG": ""}
    args = ["lag", "--json"] if as_json else ["lag"]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    assert (json.loads(result.stdout) == []) if as_json else "no bindings" in result.stdout


# --- with the real platform ------------------------------------------------------------


def _binding_lag(plat: Any, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(plat.cli("lag", "--json", "--binding", name).stdout)
    return [r for r in rows if r["kind"] == "binding"]


def test_lag_grows_while_the_platform_is_down_and_drains_after_a_restart(
        settings: Settings, unique_topic: Callable[..., str], tmp_path: Any) -> None:
    from tests.platform_harness import Platform, produce_json

    topic = unique_topic(partitions=2)
    plat = Platform(settings, tmp_path, allow=("tests.funcs.ledger",))
    try:
        plat.cli("bind", "orders", "--topic", topic, "--function", "tests.funcs.ledger:record")
        plat.start("scheduler")
        plat.start("tailers")
        # Keyed, so both partitions get records: a partition that never had one keeps no
        # committed offset, and keyless records may all land on one (sticky partitioner).
        produce_json(settings, topic, [{"id": i} for i in range(100)], key_of="id")
        wait_until(lambda: sum(r["lag"] for r in _binding_lag(plat, "orders")) == 0 and
                   all(r["committed"] is not None for r in _binding_lag(plat, "orders")),
                   60, "the running platform drained the topic")

        assert plat.stop("tailers") == 0  # the platform's tailers are down: lag must grow
        produce_json(settings, topic, [{"id": i} for i in range(100, 150)], key_of="id")
        assert sum(r["lag"] for r in _binding_lag(plat, "orders")) == 50
        produce_json(settings, topic, [{"id": i} for i in range(150, 180)], key_of="id")
        rows = _binding_lag(plat, "orders")
        assert sum(r["lag"] for r in rows) == 80
        assert all(r["lag_seconds"] > 0 for r in rows if r["lag"])

        plat.start("tailers", "tailers2")
        wait_until(lambda: sum(r["lag"] for r in _binding_lag(plat, "orders")) == 0, 60,
                   "lag back to 0 after the restart")
        assert [r["end"] for r in _binding_lag(plat, "orders")] == \
            [r["committed"] for r in _binding_lag(plat, "orders")]
    finally:
        plat.stop_all()


def test_watch_json_prints_one_document_per_read(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    import os
    import subprocess
    import sys

    topic = unique_topic(partitions=1)
    BindingRegistry(settings).put(Binding(name="w", source=Source("kafka", topic), function="m:f"))
    env = dict(os.environ, ASYNCTIER_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
               ASYNCTIER_PREFIX=settings.prefix, ASYNCTIER_CONFIG="")
    proc = subprocess.Popen([sys.executable, "-m", "asynctier", "lag", "--watch", "--json",
                             "--interval", "0.2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert [r["lag"] for r in first if r["kind"] == "binding"] == [0]
        _produce(settings.kafka_bootstrap, topic, 5, 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = json.loads(proc.stdout.readline())
            if [r["lag"] for r in rows if r["kind"] == "binding"] == [5]:
                break
        else:
            raise AssertionError("--watch never showed the new lag")
    finally:
        proc.terminate()
        proc.wait(10)

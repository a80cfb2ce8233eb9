"""The queue seen by operators: ``asynctier lag`` rows for queue bindings, the depth gauges,
and lease expiries counted where the tailer leases. Real PostgreSQL and Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from asynctier.cli import main
from asynctier.dev import free_port
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue.backlog import (
    MAX_COUNTING_SHARE,
    QueueDepthCollector,
    read_backlog,
    wait_after,
)
from asynctier.queue.items import Dead, Nack, NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.queue.store import QueueStore
from asynctier.tailers.queue import QueueSource
from tests.helpers import wait_until


def _bind(settings: Settings, name: str, topic: str, namespace: str) -> Binding:
    binding = Binding(name=name, source=Source("queue", topic), function="m:f",
                      tenant=namespace).validate()
    BindingRegistry(settings).put(binding)
    return binding


def _enqueue(store: QueueStore, namespace: str, topic: str, n: int, **fields: Any) -> None:
    store.enqueue(namespace, [NewItem(topic, b"{}", **fields) for _ in range(n)])


def _env(settings: Settings, shards: str) -> dict[str, str]:
    return {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_CONFIG": "",
            "ASYNCTIER_QUEUE_SHARDS": shards}


def _lag(settings: Settings, shards: str, *args: str) -> Any:
    result = CliRunner().invoke(main, ["lag", *args], env=_env(settings, shards))
    assert result.exit_code == 0, result.output
    return result


def _queue_rows(settings: Settings, shards: str, *args: str) -> list[dict[str, Any]]:
    rows = json.loads(_lag(settings, shards, "--json", *args).stdout)
    return [r for r in rows if r["kind"] == "queue"]


def test_lag_shows_each_queue_bindings_backlog(
        settings: Settings, postgres: str, queue_store: QueueStore,
        queue_namespace: str) -> None:
    _bind(settings, "encodes", "encodes", queue_namespace)
    _bind(settings, "thumbs", "thumbs", queue_namespace)
    _enqueue(queue_store, queue_namespace, "encodes", 7,
             deliver_after_ms=int(time.time() * 1000) - 60_000)  # waiting for a minute
    _enqueue(queue_store, queue_namespace, "encodes", 3, delay_s=3600)
    queue_store.lease(queue_namespace, "encodes", 2, 60, "someone")
    for item in queue_store.lease(queue_namespace, "encodes", 1, 60, "someone"):
        queue_store.resolve(queue_namespace, "encodes", "someone",
                            deads=[Dead(item.id, "rejected", "a test")])

    rows = {r["name"]: r for r in _queue_rows(settings, postgres)}
    assert set(rows) == {"encodes", "thumbs"}
    enc = rows["encodes"]
    assert (enc["namespace"], enc["topic"], enc["error"]) == (queue_namespace, "encodes", None)
    assert (enc["ready"], enc["delayed"], enc["leased"], enc["dead"]) == (4, 3, 2, 1)
    assert 60 <= enc["oldest_ready_age_s"] < 180
    thumbs = rows["thumbs"]
    assert (thumbs["ready"], thumbs["dead"], thumbs["oldest_ready_age_s"]) == (0, 0, 0)

    only = _queue_rows(settings, postgres, "--binding", "thumbs")
    assert [r["name"] for r in only] == ["thumbs"]
    table = _lag(settings, postgres).stdout
    assert "queue backlog" in table and "encodes" in table


def test_lag_says_a_queue_shard_is_down_and_still_succeeds(
        settings: Settings, queue_namespace: str) -> None:
    nowhere = f"postgresql://asynctier@127.0.0.1:{free_port()}/asynctier"
    _bind(settings, "lost", "lost", queue_namespace)
    started = time.monotonic()
    (row,) = _queue_rows(settings, nowhere)
    assert time.monotonic() - started < 30
    assert row["name"] == "lost" and row["ready"] is None
    assert "unavailable" in row["error"] and "is its PostgreSQL running?" in row["error"]
    assert "unavailable" in _lag(settings, nowhere).stdout


def test_lag_watch_json_follows_the_queue(
        settings: Settings, postgres: str, queue_store: QueueStore,
        queue_namespace: str) -> None:
    _bind(settings, "watched", "watched", queue_namespace)
    env = dict(os.environ, **_env(settings, postgres))
    proc = subprocess.Popen([sys.executable, "-m", "asynctier", "lag", "--watch", "--json",
                             "--interval", "0.2", "--binding", "watched"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert [(r["kind"], r["ready"]) for r in first if r["kind"] == "queue"] == [
            ("queue", 0)]
        _enqueue(queue_store, queue_namespace, "watched", 5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = json.loads(proc.stdout.readline())
            if [r["ready"] for r in rows if r["kind"] == "queue"] == [5]:
                break
        else:
            raise AssertionError("--watch never showed the new items")
    finally:
        proc.terminate()
        proc.wait(10)


def _depth(binding: str, tenant: str, topic: str, state: str) -> float | None:
    return REGISTRY.get_sample_value("asynctier_queue_items", {
        "binding": binding, "tenant": tenant, "state": state})


def test_the_collector_exports_depth_by_state_and_drops_removed_bindings(
        settings: Settings, postgres: str, queue_store: QueueStore,
        queue_namespace: str) -> None:
    ns = queue_namespace
    binding = Binding(name="depth", source=Source("queue", "depth"), function="m:f", tenant=ns)
    kafka = Binding(name="stream", source=Source("kafka", "stream"), function="m:f")
    bindings = {"depth": binding, "stream": kafka}
    _enqueue(queue_store, ns, "depth", 6)
    _enqueue(queue_store, ns, "depth", 2, delay_s=3600)
    queue_store.lease(ns, "depth", 1, 60, "someone")
    with ShardedQueue([postgres]) as queue:
        collector = QueueDepthCollector(settings, lambda: dict(bindings), interval_s=0.2,
                                        queue=queue)
        collector.start()
        try:
            wait_until(lambda: _depth("depth", ns, "depth", "ready") == 5, 20, "ready 5")
            assert _depth("depth", ns, "depth", "delayed") == 2
            assert _depth("depth", ns, "depth", "leased") == 1
            assert _depth("depth", ns, "depth", "dead") == 0
            oldest = REGISTRY.get_sample_value("asynctier_queue_oldest_ready_seconds", {
                "binding": "depth", "tenant": ns})
            assert oldest is not None and 0 <= oldest < 120
            _enqueue(queue_store, ns, "depth", 4)
            wait_until(lambda: _depth("depth", ns, "depth", "ready") == 9, 20, "ready 9")
            bindings.pop("depth")
            wait_until(lambda: _depth("depth", ns, "depth", "ready") is None, 20,
                       "the removed binding's series dropped")
        finally:
            collector.stop()


@given(took=st.floats(0, 600), interval=st.floats(0.1, 60))
def test_the_collector_counts_at_most_its_share_of_the_time(took: float,
                                                            interval: float) -> None:
    """A topic of millions takes a fraction of a second to count: the wait after such a
    pass stretches so that counting is at most MAX_COUNTING_SHARE of the time; a quick
    pass waits the interval."""
    wait = wait_after(took, interval)
    assert wait >= interval
    assert took <= MAX_COUNTING_SHARE * (took + wait) * (1 + 1e-9)
    if took <= MAX_COUNTING_SHARE * interval:
        assert wait == interval


def test_backlog_rows_of_a_down_shard_carry_its_error(queue_namespace: str) -> None:
    nowhere = f"postgresql://asynctier@127.0.0.1:{free_port()}/asynctier"
    bindings = [Binding(name=f"b{i}", source=Source("queue", f"t{i}"), function="m:f",
                        tenant=queue_namespace) for i in range(3)]
    with ShardedQueue([nowhere], timeout_s=1.0) as queue:
        started = time.monotonic()
        rows = read_backlog(queue, bindings)
        took = time.monotonic() - started
    assert [r.name for r in rows] == ["b0", "b1", "b2"]
    assert all(r.error and r.ready is None for r in rows)
    assert took < 2.5, f"the down shard was asked more than once ({took:.1f}s)"


def _expiries(binding: str, tenant: str) -> float:
    return REGISTRY.get_sample_value("asynctier_queue_lease_expiries_total", {
        "binding": binding, "tenant": tenant}) or 0.0


def test_items_leased_again_after_their_lease_ran_out_are_counted(
        postgres: str, queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    _enqueue(queue_store, ns, "expiring", 5)
    first = queue_store.lease(ns, "expiring", 3, 0.2, "dead-owner")
    assert not any(item.lease_ran_out for item in first)
    queue_store.resolve(ns, "expiring", "dead-owner",
                        nacks=[Nack(first[0].id, 0.0)])  # given back: not an expiry
    wait_until(lambda: queue_store.counts(ns, "expiring")[0].leased == 0, 10,
               "the other two leases ran out (by the database's clock)")
    binding = Binding(name="exp", source=Source("queue", "expiring", lease_s=30.0), function="m:f",
                      tenant=ns)
    before = _expiries("exp", ns)
    with ShardedQueue([postgres]) as queue:
        source = QueueSource(binding, queue, "tailer", threading.Event())
        again = source.read(10, 0.0)
        source.close()
    assert len(again) == 5
    ran_out = {item.id for item in again if item.lease_ran_out}
    assert ran_out == {first[1].id, first[2].id}
    assert _expiries("exp", ns) - before == 2

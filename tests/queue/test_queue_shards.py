"""Sharding over real PostgreSQL servers, and a shard that goes down and comes back."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from asynctier import dev as devstack
from asynctier.platform.errors import ConfigError, QueueUnavailable, ServiceError
from asynctier.queue import NewItem, QueueStore
from asynctier.queue.dsn import redact_dsn
from asynctier.queue.shards import ShardedQueue, rendezvous
from tests.conftest import service_unavailable
from tests.helpers import wait_until


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[devstack.PostgresNode]]:
    """Two PostgreSQL servers of this module's own (it restarts one)."""
    nodes: list[devstack.PostgresNode] = []
    try:
        for n in range(2):
            nodes.append(devstack.start_test_postgres(tmp_path_factory.mktemp(f"shard{n}")))
    except ServiceError as exc:
        for node in nodes:
            node.stop()
        service_unavailable("PostgreSQL", exc)
    yield nodes
    for node in nodes:
        node.stop()
        if "asynctier-pg-" in str(node.data_dir):
            shutil.rmtree(node.data_dir.parent, ignore_errors=True)


def items_per_shard(dsn: str, namespace: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT topic, count(*) FROM asynctier_queue_items "
                            "WHERE namespace = %s GROUP BY topic", (namespace,)).fetchall()
    return {r[0]: r[1] for r in rows}


def test_topics_spread_over_two_shards_each_item_on_its_topics_shard(
        servers: list[devstack.PostgresNode], queue_namespace: str) -> None:
    topics = [f"topic{n}" for n in range(24)]
    with ShardedQueue([s.dsn for s in servers]) as queue:
        results = queue.enqueue(queue_namespace, [NewItem(t, f"{t}/{k}".encode(), id=str(k))
                                                  for k in range(10) for t in topics])
        assert len(results) == 240 and all(r.created for r in results)
        held = [items_per_shard(s.dsn, queue_namespace) for s in servers]
        assert all(held), "both shards hold topics"
        for topic in topics:
            home = queue.shard_of(queue_namespace, topic)
            on = [i for i, h in enumerate(held) if topic in h]
            assert on == [queue.stores.index(home)] and held[on[0]][topic] == 10
        leased = queue.lease(queue_namespace, "topic3", 20, 30, "a")
        assert sorted(g.payload for g in leased) == sorted(f"topic3/{k}".encode()
                                                           for k in range(10))
        counts = {c.topic: c.ready for c in queue.counts(queue_namespace)}
        assert counts == {t: (0 if t == "topic3" else 10) for t in topics}
        placement = {t: (home, on) for ns, t, home, on in queue.placement()
                     if ns == queue_namespace}
        assert all(on == [home] for home, on in placement.values())


def test_adding_a_shard_moves_only_the_topics_that_hash_to_it(
        servers: list[devstack.PostgresNode], postgres: str, queue_namespace: str) -> None:
    # a third shard takes about a third of the topics: 100 of 300, a standard deviation
    # of 8 (the hash's inputs, the namespace and the servers' ports, change every run)
    topics = [f"t{n}" for n in range(300)]
    two = [s.dsn for s in servers]
    with ShardedQueue(two) as before, ShardedQueue([*two, postgres]) as after:
        before.enqueue(queue_namespace, [NewItem(t, b"x") for t in topics])
        moved = [t for t in topics if before.shard_of(queue_namespace, t).name
                 != after.shard_of(queue_namespace, t).name]
        assert len(topics) // 6 < len(moved) < len(topics) // 2
        assert all(after.shard_of(queue_namespace, t).name == redact_dsn(postgres)
                   for t in moved)
        misplaced = {t for ns, t, home, on in after.placement()
                     if ns == queue_namespace and on != [home]}
        assert misplaced == set(moved)


def test_rendezvous_is_stable_and_moves_about_one_in_n() -> None:
    names = [f"postgresql://db{n}:5432/q" for n in range(4)]
    keys = [("ns", f"topic{n}") for n in range(4000)]
    first = [rendezvous(ns, t, names) for ns, t in keys]
    assert first == [rendezvous(ns, t, names) for ns, t in keys]
    assert all(first.count(i) > 800 for i in range(4))
    grown = [rendezvous(ns, t, [*names, "postgresql://db4:5432/q"]) for ns, t in keys]
    moved = [(a, b) for a, b in zip(first, grown, strict=True) if a != b]
    assert all(b == 4 for _, b in moved)
    assert 600 < len(moved) < 1000  # about 1/5 of 4000


def test_shards_listed_twice_are_refused() -> None:
    with pytest.raises(ConfigError, match="more than once"):
        ShardedQueue(["postgresql://a@h:1/q", "postgresql://a:secret@h:1/q"])
    with pytest.raises(ConfigError, match="no queue shard"):
        ShardedQueue([])


def test_the_shard_name_has_no_password() -> None:
    assert redact_dsn("postgresql://u:pw@h:5433/db") == "postgresql://u@h:5433/db"
    assert redact_dsn("host=h port=1 user=u password=pw dbname=d") == "postgresql://u@h:1/d"
    with pytest.raises(ConfigError) as caught:
        redact_dsn("not a dsn at all = = =")
    assert "not a dsn" not in str(caught.value)


def test_a_shard_down_raises_queue_unavailable_and_works_again_after(
        servers: list[devstack.PostgresNode], queue_namespace: str) -> None:
    node = servers[1]
    with QueueStore(node.dsn, timeout_s=2.0) as store:
        store.enqueue(queue_namespace, [NewItem("r", b"kept", id="k")])
        node.stop()
        started = time.monotonic()
        with pytest.raises(QueueUnavailable) as caught:
            store.lease(queue_namespace, "r", 1, 30, "a")
        assert time.monotonic() - started < 10
        message = str(caught.value)
        assert redact_dsn(node.dsn) in message and "unavailable" in message
        with pytest.raises(QueueUnavailable):
            store.counts(queue_namespace)
        node.start()
        got = wait_until(lambda: _lease_or_none(store, queue_namespace), 30,
                         "the store works again once PostgreSQL is back")
        assert [g.payload for g in got] == [b"kept"]


def _lease_or_none(store: QueueStore, namespace: str) -> list[object] | None:
    try:
        return list(store.lease(namespace, "r", 1, 30, "a"))
    except QueueUnavailable:
        return None


def test_a_server_that_cannot_start_names_the_install_command(tmp_path: Path) -> None:
    node = devstack.PostgresNode(tmp_path / "pg", devstack.free_port(), path=str(tmp_path))
    with pytest.raises(ServiceError, match="apt-get install -y postgresql"):
        node.start()


def test_queue_shards_come_from_the_file_then_the_environment(tmp_path: Path) -> None:
    from asynctier.platform.config import DEFAULT_QUEUE_SHARD, Settings

    assert Settings().queue_shards == (DEFAULT_QUEUE_SHARD,)
    doc = {"queue": {"shards": ["postgresql://a@h1:5432/q", "postgresql://a@h2:5432/q"]}}
    settings = Settings.from_mapping(doc)
    assert settings.queue_shards == ("postgresql://a@h1:5432/q", "postgresql://a@h2:5432/q")
    env = {"ASYNCTIER_QUEUE_SHARDS": "postgresql://x@h3/q, postgresql://x@h4/q"}
    assert settings.from_env(env).queue_shards == ("postgresql://x@h3/q", "postgresql://x@h4/q")
    config = tmp_path / "asynctier.toml"
    config.write_text('[queue]\nshards = ["postgresql://f@h5/q"]\n')
    assert Settings.load(config, env={}).queue_shards == ("postgresql://f@h5/q",)
    with pytest.raises(ConfigError, match="non-empty list"):
        Settings.from_mapping({"queue": {"shards": []}})
    with pytest.raises(ConfigError, match="non-empty list"):
        Settings.from_mapping({"queue": {"shards": "postgresql://a@h/q"}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['shard'\] in \[queue\]"):
        Settings.from_mapping({"queue": {"shard": ["x"]}})


def test_as_root_the_server_runs_as_an_unprivileged_user(
        servers: list[devstack.PostgresNode]) -> None:
    import os
    import pwd

    pid = servers[0].daemon.pid()
    assert pid is not None
    owner = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    if os.geteuid() == 0:
        assert owner in ("postgres", "nobody")
        assert pwd.getpwuid(servers[0].cluster_dir.stat().st_uid).pw_name == owner
    else:
        assert owner == pwd.getpwuid(os.geteuid()).pw_name

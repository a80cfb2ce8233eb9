"""The queue table stays small over a long drain; migrations apply once, even at once."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from asynctier.queue import NewItem, QueueStore
from asynctier.queue.migrate import migrate, migrations
from tests.helpers import wait_until

DRAIN_ITEMS = 50_000
#: Each drained item leaves two dead row versions (its lease's update, its ack's delete):
#: 100,000 over the drain if nothing reclaimed them. Autovacuum (naptime 1 s on the test
#: server, the table's threshold 1,000 rows at any size, no cost delay) reclaims them
#: while the drain runs. How many wait at once depends on the drain's speed and on how
#: late a vacuum starts when another test shares the two cores, so the test asserts what
#: makes the table stay small: vacuums ran during the drain and the dead tuples fell while
#: it went on, never near the total.
UNRECLAIMED = 2 * DRAIN_ITEMS


def dead_tuples(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute("SELECT n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
                           "WHERE relname = 'asynctier_queue_items'").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_dead_tuples_stay_bounded_over_a_long_drain(queue_store: QueueStore,
                                                    queue_namespace: str) -> None:
    with psycopg.connect(queue_store.dsn) as conn:
        row = conn.execute("SELECT setting::int FROM pg_settings "
                           "WHERE name = 'autovacuum_naptime'").fetchone()
    if row is None or row[0] > 1:
        pytest.skip(f"the server's autovacuum_naptime is {row}s: the bound holds for 1 s "
                    "(the dev stack's and the tests' servers)")
    _, vacuums_before = dead_tuples(queue_store.dsn)
    samples = []
    drained = 0
    for batch in range(DRAIN_ITEMS // 1000):
        queue_store.enqueue(queue_namespace, [NewItem("drain", b"{}", id=f"{batch}.{n}")
                                              for n in range(1000)])
        for _ in range(2):
            got = queue_store.lease(queue_namespace, "drain", 500, 30, "a")
            drained += queue_store.resolve(queue_namespace, "drain", "a",
                                           acks=[g.id for g in got]).acked
        samples.append(dead_tuples(queue_store.dsn))
    assert drained == DRAIN_ITEMS
    dead = [d for d, _ in samples]
    assert samples[-1][1] > vacuums_before, f"no vacuum during the drain: {samples}"
    assert any(later < earlier - 1000 for at, earlier in enumerate(dead)
               for later in dead[at + 1:]), f"the dead tuples never fell: {dead}"
    assert max(dead) < UNRECLAIMED * 0.9, dead
    wait_until(lambda: dead_tuples(queue_store.dsn)[0] < 5_000, 30,
               "autovacuum reclaimed the drain's dead tuples")
    assert dead_tuples(queue_store.dsn)[1] > vacuums_before


@pytest.fixture
def fresh_database(postgres: str) -> Iterator[str]:
    """A database of its own (no queue schema yet), dropped after the test."""
    name = f"mig_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(postgres)
    params["dbname"] = name
    yield make_conninfo(**params)  # type: ignore[arg-type]
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_migrations_apply_once_when_many_processes_start_at_once(fresh_database: str) -> None:
    applied: list[list[int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def run() -> None:
        try:
            with psycopg.connect(fresh_database) as conn:
                start.wait()
                applied.append(migrate(conn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    versions = [m.version for m in migrations()]
    assert sorted(applied, key=len) == [[]] * 5 + [versions]
    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute("SELECT version FROM asynctier_queue_migrations").fetchall()
        assert [r[0] for r in rows] == versions
        assert migrate(conn) == []  # idempotent
    with QueueStore(fresh_database) as store:  # a store on it migrates nothing and works
        assert store.enqueue("ns", [NewItem("t", b"x")])[0].created


def test_migration_files_are_numbered_from_one() -> None:
    found = migrations()
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    assert found[0].name == "init"
    assert "asynctier_queue_items_lease" in found[0].sql

"""Queue disaster recovery: a shard's primary SIGKILLed mid-stream, its synchronous standby
promoted by the watcher (``asynctier queue failover --auto``), the platform moving to it
by itself.

Real PostgreSQL primary and hot standby (pg_basebackup, synchronous_standby_names), the
real scheduler, tailers and Submitter; workloads go through the SDK, the ledger function
(``tests.faults.funcs:run``) says what ran.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from asynctier.dev.postgres import PostgresNode
from asynctier.dev.replica import crash, pair_dsn
from asynctier.dev.testing import postgres_data_root, start_test_postgres_pair
from asynctier.platform.config import Settings, split_shards
from asynctier.platform.errors import ConfigError, QueueError, ServiceError
from asynctier.queue.dsn import HostState, choose_primary, probe, redact_dsn, shard_hosts
from asynctier.queue.failover import fail_over
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.submitter.protocol import Workload
from tests.conftest import service_unavailable
from tests.faults.checker import read_ledger, succeeded
from tests.helpers import wait_until
from tests.platform_harness import REPO
from tests.submitter_harness import SubmitterPlatform


@dataclass
class Pair:
    """A primary and its synchronous standby; ``dsn`` is the shard's address."""

    primary: PostgresNode
    standby: PostgresNode
    dsn: str


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    try:
        primary, standby = start_test_postgres_pair(tmp_path)
    except ServiceError as exc:
        service_unavailable("PostgreSQL with a standby", exc)
    try:
        yield Pair(primary, standby, pair_dsn(primary, standby))
    finally:
        primary.stop(10.0)
        standby.stop(10.0)
        base = postgres_data_root(tmp_path)
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


def test_a_shard_with_a_standby_keeps_its_first_hosts_name() -> None:
    """A multi-host address: one shard named after its first host (so it hashes as before
    the standby was added), one single-host address per host; the environment's list
    splits between shards, not between one shard's hosts."""
    dsn = "postgresql://u:pw@pg-a:5432,pg-b:5433/q"
    assert redact_dsn(dsn) == redact_dsn("postgresql://u:pw@pg-a:5432/q") \
        == "postgresql://u@pg-a:5432/q"
    assert [redact_dsn(h) for h in shard_hosts(dsn)] == ["postgresql://u@pg-a:5432/q",
                                                        "postgresql://u@pg-b:5433/q"]
    assert all("password=pw" in h for h in shard_hosts(dsn))
    one = "postgresql://u@solo:5432/q"
    env = Settings().from_env({"ASYNCTIER_QUEUE_SHARDS": f"{one},{dsn}"})
    assert env.queue_shards == (one, dsn)
    assert split_shards("host=a dbname=x,host=b,c dbname=y") == ("host=a dbname=x",
                                                                 "host=b,c dbname=y")
    with pytest.raises(ConfigError, match="3 hosts but 2 ports"):
        shard_hosts("host=a,b,c port=1,2 dbname=q")


def test_the_primary_is_the_writable_host_on_the_highest_timeline() -> None:
    """A standby or a fenced host is never chosen; of two writable hosts the higher
    timeline wins (a promoted standby over an old primary that came back), and none
    below a timeline already seen."""
    def host(name: str, recovery: bool = False, read_only: bool = False,
             timeline: int | None = 1) -> HostState:
        return HostState(f"host={name}", recovery, read_only,
                         None if recovery else timeline, recovery)

    old, new, standby = host("old"), host("new", timeline=2), host("sb", recovery=True)
    assert choose_primary([old, standby]) == old
    assert choose_primary([old, new]) == new
    assert choose_primary([None, standby]) is None
    assert choose_primary([host("old", read_only=True), standby]) is None
    assert choose_primary([old, None], min_timeline=2) is None


def test_a_fenced_old_primary_is_left_and_acknowledged_items_survive(pair: Pair) -> None:
    """Enqueued items are on the standby (flushed before the enqueue returns, then
    replayed);
    ``asynctier queue failover SHARD`` fences the primary that still answers (read-only)
    and promotes the standby; a ShardedQueue opened before moves to the new primary by
    itself, keeps the shard's name, and every item is still there. A second failover
    finds no standby and says so."""
    queue = ShardedQueue([pair.dsn], timeout_s=3.0)
    try:
        queue.enqueue("ns", [NewItem("t", b"x", id=f"i{n}") for n in range(50)])
        def on_standby() -> bool:  # flushed there on return (synchronous_commit=on),
            # visible once replayed: a read can come a moment before the replay
            with psycopg.connect(pair.standby.dsn) as conn:
                try:
                    row = conn.execute("SELECT count(*) FROM asynctier_queue_items").fetchone()
                except psycopg.errors.UndefinedTable:
                    return False
            return row is not None and row[0] == 50

        wait_until(on_standby, 10.0, "the 50 items replayed on the standby", interval=0.05)
        name = queue.routes[0].name
        done = subprocess.run([sys.executable, "-m", "asynctier", "queue", "failover", name],
                              env={**os.environ, "ASYNCTIER_QUEUE_SHARDS": pair.dsn},
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert f"queue shard {name}: promoted" in done.stdout
        assert "(timeline 2)" in done.stdout and f"fenced {name}" in done.stdout
        old, new = probe(pair.primary.dsn), probe(pair.standby.dsn)
        assert old is not None and old.read_only and not old.writable
        assert new is not None and new.writable and new.timeline == 2
        queue.enqueue("ns", [NewItem("t", b"y", id="after")])
        assert queue.counts("ns", "t")[0].ready == 51
        assert queue.stores[0].dsn == queue.routes[0].hosts[1]
        assert queue.stores[0].name == queue.routes[0].name  # no topic moves shard
        with pytest.raises(QueueError, match="has no standby in recovery to promote"):
            fail_over(pair.dsn)
    finally:
        queue.close()


# --------------------------------------------------------------------------- end to end


@dataclass
class Stream:
    """What the callers were answered, and when."""

    acked: set[int] = field(default_factory=set)
    sent_after_kill: set[int] = field(default_factory=set)
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def doc(i: int) -> bytes:
    return json.dumps({"id": i}).encode()


def start_watcher(plat: SubmitterPlatform, after: str) -> None:
    """``asynctier queue failover --auto --after AFTER`` as one of the platform's
    processes (stopped with the others), once it watches."""
    log = open(plat.folder / "watcher.log", "ab")  # noqa: SIM115 - owned by the process
    plat.procs["watcher"] = subprocess.Popen(
        [sys.executable, "-m", "asynctier", "queue", "failover", "--auto", "--after", after],
        env=plat.env(), stdout=log, stderr=log, cwd=REPO)
    wait_until(lambda: "watching 1 shard" in (plat.folder / "watcher.log").read_text(), 60.0,
               "the watcher started", interval=0.1)


def first_lease_after(standby_dsn: str, namespace: str, since: float, timeout_s: float,
                      started: Callable[[], list[float]]) -> float:
    """When (epoch s) the drain resumed after ``since``: the first item leased then, as
    the standby (the new primary once promoted) records it, or, if its row was acked
    and gone before a look found it, the first start (``started``: start times of items
    sent after ``since``, which only the new primary can have leased): an upper bound."""
    found: list[float] = []
    conn = psycopg.connect(standby_dsn, autocommit=True)  # promotion keeps it open

    def resumed() -> bool:
        row = conn.execute("SELECT min(leased_ms) FROM asynctier_queue_items "
                           "WHERE namespace = %s AND leased_ms > %s",
                           (namespace, int(since * 1000))).fetchone()
        if row is not None and row[0] is not None:
            found.append(row[0] / 1000)
        found.extend(started())
        return bool(found)

    try:
        wait_until(resumed, timeout_s, "an item leased on the new primary", interval=0.02)
    finally:
        conn.close()
    return min(found)


def run_failover(settings: Settings, folder: Path, pair: Pair, namespace: str, total: int,
                 batch: int, timeout_s: float, after: str) -> dict[str, float]:
    """Submit ``total`` items in batches while the platform drains; SIGKILL the primary
    (its whole process group) once a third is acknowledged (each caller sends its last
    third after the kill, so the stream goes on across it); assert that every
    acknowledged item ran; return the figures."""
    plat = SubmitterPlatform(settings, folder, [pair.dsn])
    try:
        plat.bind_queue("q", "work", namespace, "--lease", "2s")
        plat.start("scheduler")
        plat.start("tailers")
        plat.start_submitter()
        start_watcher(plat, after)
        client = plat.client(deadline_s=60.0)
        stream = Stream()
        killed = threading.Event()
        kill_at = [0.0]

        def caller(ids: range) -> None:
            last_third = ids.start + len(ids) * 2 // 3
            for at in range(ids.start, ids.stop, batch):
                chunk = range(at, min(at + batch, ids.stop))
                if at >= last_third:  # the kill comes mid-stream, however fast the rest
                    killed.wait(timeout_s)
                sent_after = killed.is_set()
                results = client.submit_many("q", [Workload(doc(i), id=f"f{i}")
                                                   for i in chunk])
                with stream.lock:
                    for i, r in zip(chunk, results, strict=True):
                        if r.status in ("accepted", "duplicate"):
                            stream.acked.add(i)
                            if sent_after:
                                stream.sent_after_kill.add(i)
                        else:
                            stream.refused += 1

        half = total // 2
        callers = [threading.Thread(target=caller, args=(r,))
                   for r in (range(0, half), range(half, total))]
        for t in callers:
            t.start()
        wait_until(lambda: len(stream.acked) >= total // 3
                   and len(succeeded(plat.calls())) > 0, timeout_s, "a third acknowledged "
                   "and the drain under way", interval=0.05)
        kill_at[0] = time.time()
        assert crash(pair.primary)
        killed.set()
        def started_after_kill() -> list[float]:
            with stream.lock:
                sent = set(stream.sent_after_kill)
            return [c.at for c in read_ledger(plat.ledger) if c.kind == "S" and c.id in sent]

        first_lease = first_lease_after(pair.standby.dsn, namespace, kill_at[0], timeout_s,
                                        started_after_kill)
        for t in callers:
            t.join(timeout_s)
        assert not any(t.is_alive() for t in callers), "the callers did not finish"
        client.close()
        assert stream.refused == 0 and len(stream.acked) == total
        wait_until(lambda: stream.acked <= set(succeeded(plat.calls())), timeout_s,
                   "every acknowledged item ran", interval=0.5)
        calls = read_ledger(plat.ledger)
        runs = succeeded(calls)
        after = [c.at for c in calls if c.kind == "S" and c.id in stream.sent_after_kill]
        starts = sorted(c.at for c in calls if c.kind == "S")
        gaps = [b - a for a, b in itertools.pairwise(starts)
                if b > kill_at[0] - 1 and a < kill_at[0] + 30]
        figures = {"items": float(total), "acknowledged": float(len(stream.acked)),
                   "duplicates": float(sum(n - 1 for n in runs.values())),
                   "first_lease_on_the_new_primary_s": first_lease - kill_at[0],
                   "first_run_of_an_item_sent_after_kill_s": min(after) - kill_at[0],
                   "longest_pause_in_the_ledger_s": max(gaps, default=0.0)}
        print(f"\nqueue failover (primary killed at {kill_at[0]:.3f}):", json.dumps(figures))
        assert "promoted" in (folder / "watcher.log").read_text()
        assert figures["first_lease_on_the_new_primary_s"] < 10.0
        old_primary_comes_back_fenced(pair)
        return figures
    finally:
        plat.stop_all()


def old_primary_comes_back_fenced(pair: Pair) -> None:
    """The killed primary restarted (timeline 1, writable by its own account): the
    watcher makes it read-only, and a commit there is refused."""
    pair.primary.start()
    wait_until(lambda: (s := probe(pair.primary.dsn)) is not None and s.read_only, 30.0,
               "the watcher fenced the old primary", interval=0.2)

    def refused() -> bool:
        try:
            with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE split_brain (i int)")
        except psycopg.errors.ReadOnlySqlTransaction:
            return True
        except psycopg.OperationalError:  # the watcher ends the sessions of what it fenced
            return False
        raise AssertionError("the fenced old primary accepted a commit: split brain")

    wait_until(refused, 10.0, "a commit refused on the old primary", interval=0.1)


def test_failover_mid_stream_loses_nothing_acknowledged(
        settings: Settings, tmp_path: Path, pair: Pair, queue_namespace: str) -> None:
    """2,000 items through the Submitter while the platform drains; the primary is
    SIGKILLed after a third; the watcher (--after 1s) promotes the standby: every
    acknowledged item ran, drain resumed (the first lease on the promoted standby) within
    10 s of the kill (duplicates counted); the old
    primary, restarted, is fenced by the watcher."""
    run_failover(settings, tmp_path, pair, queue_namespace, 2000, 50, 120.0, "1s")


@pytest.mark.slow
def test_failover_of_20k_items_mid_stream(
        settings: Settings, tmp_path: Path, pair: Pair, queue_namespace: str) -> None:
    """The same with 20,000 items in batches of 200, the watcher's default --after 3s."""
    run_failover(settings, tmp_path, pair, queue_namespace, 20_000, 200, 600.0, "3s")

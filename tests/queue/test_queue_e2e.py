"""The queue source end to end: real PostgreSQL, Kafka and Redis, the real processes.

A queue binding (``bind --queue``) gets a queue tailer in ``asynctier run tailers``; every
call goes through the scheduler process to ``tests.faults.funcs:run``, which writes each
start and success to a ledger (``id attempt epoch S|D pid source``).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from asynctier import dev
from asynctier.platform.config import Settings
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.queue.store import QueueStore
from tests.faults.checker import Call, succeeded
from tests.faults.harness import FUNCTION, FaultPlatform
from tests.helpers import wait_until


class QueuePlatform(FaultPlatform):
    """The platform's processes with the queue's shards in their environment."""

    def __init__(self, settings: Settings, folder: Path, shards: Sequence[str]) -> None:
        super().__init__(settings, folder, env={"ASYNCTIER_QUEUE_SHARDS": ",".join(shards)})

    def bind_queue(self, name: str, topic: str, namespace: str, *extra: str) -> None:
        """``asynctier bind NAME --queue TOPIC --tenant NAMESPACE ...``."""
        self.cli("bind", name, "--queue", topic, "--tenant", namespace, "--function",
                 FUNCTION, *extra)


@pytest.fixture
def plat(settings: Settings, tmp_path: Path, postgres: str) -> Iterator[QueuePlatform]:
    platform = QueuePlatform(settings, tmp_path, [postgres])
    try:
        yield platform
    finally:
        platform.stop_all()


def enqueue(queue: QueueStore | ShardedQueue, namespace: str, topic: str,
            docs: Sequence[dict[str, Any]], **fields: Any) -> None:
    """Enqueue each doc as one item (id: its ``id``), in batches of 1,000."""
    for at in range(0, len(docs), 1000):
        part = docs[at:at + 1000]
        results = queue.enqueue(namespace, [
            NewItem(topic, json.dumps(doc).encode(), id=str(doc["id"]),
                    priority=doc.get("priority", 0), **fields) for doc in part])
        assert all(r.created for r in results)


def starts(calls: Sequence[Call]) -> dict[int, list[Call]]:
    """Each id's starts, in time order."""
    got: dict[int, list[Call]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.at):
        if call.kind == "S":
            got[call.id].append(call)
    return got


def wait_succeeded(plat: QueuePlatform, ids: set[int], timeout_s: float) -> Counter[int]:
    """Wait until every id of ``ids`` succeeded; the successes per id."""
    wait_until(lambda: ids <= set(succeeded(plat.calls())), timeout_s,
               "every item ran to success", interval=0.5)
    return succeeded(plat.calls())


def test_every_item_runs_once_and_higher_priorities_start_first(
        plat: QueuePlatform, queue_store: QueueStore, queue_namespace: str) -> None:
    """20,000 items ready at once, four priority bands: each ran exactly once, and the top
    band's median start precedes the bottom band's."""
    n, bands = 20_000, (0, 10, 20, 30)
    docs = [{"id": i, "priority": bands[i % 4]} for i in range(n)]
    enqueue(queue_store, queue_namespace, "work", docs)
    plat.bind_queue("q", "work", queue_namespace)
    plat.start("scheduler")
    plat.start("tailers")
    runs = wait_succeeded(plat, set(range(n)), 180)
    assert set(runs) == set(range(n)) and set(runs.values()) == {1}
    first = {i: calls[0].at for i, calls in starts(plat.calls()).items()}
    median = {band: statistics.median(first[i] for i in range(n) if bands[i % 4] == band)
              for band in bands}
    assert median[30] < median[20] < median[10] < median[0], median
    [counts] = queue_store.counts(queue_namespace, "work")
    assert (counts.ready, counts.leased, counts.dead) == (0, 0, 0)


def test_delays_retries_dead_items_and_replay(
        plat: QueuePlatform, queue_store: QueueStore, queue_namespace: str) -> None:
    """Items failing twice run 3 times, spaced by at least the ladder's steps; items that
    always fail run max-attempts times, are dead with reason max_attempts, and run once
    more after a fix and a replay; an item delayed 5 s runs 5-6 s later."""
    n = 500
    docs: list[dict[str, Any]] = [{"id": i} for i in range(n)]
    for i in range(0, n, 10):
        docs[i]["fail_until"] = 3  # 10%: fail twice
    broken = set(range(5, n, 100))  # 1%: fail until fixed
    for i in broken:
        docs[i]["until_fixed"] = True
    plat.bind_queue("q", "jobs", queue_namespace, "--max-attempts", "3",
                    "--retry-ladder", "1s,2s", "--lease", "5s")
    plat.start("scheduler")
    plat.start("tailers")
    enqueue(queue_store, queue_namespace, "jobs", docs)
    wait_succeeded(plat, set(range(n)) - broken, 120)
    wait_until(lambda: {d.id for d in queue_store.dead_items(queue_namespace, "jobs")}
               == {str(i) for i in broken}, 60, "the broken items dead")
    by_id = starts(plat.calls())
    for i in range(0, n, 10):
        times = [c.at for c in by_id[i]]
        assert [c.attempt for c in by_id[i]] == [1, 2, 3], (i, by_id[i])
        assert times[1] - times[0] >= 1.0 and times[2] - times[1] >= 2.0, (i, times)
    for i in broken:
        assert [c.attempt for c in by_id[i]] == [1, 2, 3], (i, by_id[i])
    for dead in queue_store.dead_items(queue_namespace, "jobs"):
        assert dead.reason == "max_attempts" and "until its bug is fixed" in dead.error
    assert set(succeeded(plat.calls())) & broken == set()
    Path(str(plat.ledger) + ".fixed").touch()
    plat.cli("queue", "replay", "jobs", "--namespace", queue_namespace)
    runs = wait_succeeded(plat, broken, 60)
    assert all(runs[i] == 1 for i in broken)
    assert all(len(starts(plat.calls())[i]) == 4 for i in broken)  # 3 failed + 1 after replay
    # the platform idle: an item delayed 5 s runs after 5 s, within a second
    due = time.time() + 5.0
    enqueue(queue_store, queue_namespace, "jobs", [{"id": 10_000}],
            deliver_after_ms=int(due * 1000))
    wait_succeeded(plat, {10_000}, 30)
    late = starts(plat.calls())[10_000][0].at - due
    assert 0.0 <= late <= 1.0, f"the delayed item started {late:+.3f}s from its due time"


@pytest.mark.parametrize("victim", ["tailers", "scheduler"])
def test_a_killed_process_loses_nothing(plat: QueuePlatform, queue_store: QueueStore,
                                        queue_namespace: str, victim: str) -> None:
    """SIGKILL mid-drain: every item ran; what the dead process held runs again once its
    lease ran out (tailer) or its call was sent again (scheduler)."""
    n = 1500
    plat.bind_queue("q", "drain", queue_namespace, "--lease", "2s", "--idempotent")
    enqueue(queue_store, queue_namespace, "drain",
            [{"id": i, "sleep": 0.05} for i in range(n)])  # 64 threads: over a second
    plat.start("scheduler")
    plat.supervise("scheduler")
    plat.start("tailers")
    wait_until(lambda: len(succeeded(plat.calls())) >= n // 3, 120, "a third done")
    assert len(succeeded(plat.calls())) < n, "the drain ended before the kill: nothing to tell"
    killed_at = time.time()
    plat.kill(victim)
    if victim == "tailers":
        plat.start("tailers")
    runs = wait_succeeded(plat, set(range(n)), 180)
    duplicates = sum(count - 1 for count in runs.values())
    print(f"\nqueue, {victim} SIGKILL mid-drain: {n} items, 0 lost, {duplicates} duplicates")
    again = [calls for calls in starts(plat.calls()).values()
             if len(calls) > 1 and calls[0].at < killed_at]
    assert again, "nothing the killed process held ran again"
    assert all(calls[1].at >= killed_at for calls in again)
    assert duplicates <= 1000  # at most the batches the dead process held


def test_postgresql_restarted_mid_drain_loses_nothing(
        settings: Settings, tmp_path: Path, queue_namespace: str) -> None:
    node = dev.start_test_postgres(tmp_path / "own")
    plat = QueuePlatform(settings, tmp_path, [node.dsn])
    store = QueueStore(node.dsn)
    try:
        store.migrate()
        n = 3000
        enqueue(store, queue_namespace, "pg", [{"id": i, "sleep": 0.002} for i in range(n)])
        plat.bind_queue("q", "pg", queue_namespace, "--lease", "3s")
        plat.start("scheduler")
        plat.start("tailers")
        wait_until(lambda: len(succeeded(plat.calls())) >= n // 3, 120, "a third done")
        node.restart()
        runs = wait_succeeded(plat, set(range(n)), 180)
        assert set(runs) == set(range(n))
        assert plat.alive("tailers") and plat.alive("scheduler")
    finally:
        plat.stop_all()
        store.close()
        node.stop()


def test_two_tailer_processes_never_hold_one_item_at_once(
        plat: QueuePlatform, queue_store: QueueStore, queue_namespace: str) -> None:
    """Bound --idempotent (no run-once guard to hide a double lease): with two tailer
    processes on one topic, no item starts twice and every item runs once."""
    n = 5000
    enqueue(queue_store, queue_namespace, "shared", [{"id": i} for i in range(n)])
    plat.bind_queue("q", "shared", queue_namespace, "--idempotent")
    plat.start("scheduler")
    plat.start("tailers", "tailers-a")
    plat.start("tailers", "tailers-b")
    runs = wait_succeeded(plat, set(range(n)), 120)
    twice = {i: calls for i, calls in starts(plat.calls()).items() if len(calls) > 1}
    assert not twice, list(twice.items())[:5]
    assert set(runs.values()) == {1}
    for name in ("tailers-a", "tailers-b"):
        assert "started: queue topic shared" in plat.log_text(name)


def test_topics_spread_over_two_shards_and_every_item_runs(
        settings: Settings, tmp_path: Path, postgres: str, queue_namespace: str) -> None:
    second = dev.start_test_postgres(tmp_path / "second")
    shards = [postgres, second.dsn]
    plat = QueuePlatform(settings, tmp_path, shards)
    queue = ShardedQueue(shards)
    try:
        # the namespace is new each run: of 8 fixed names, all fell on one shard 1 run in
        # 128; 4 topics per shard are taken from 64 names the hash spreads over both
        by_shard: dict[str, list[str]] = {dsn: [] for dsn in shards}
        for i in range(64):
            by_shard[queue.shard_of(queue_namespace, f"t{i}").dsn].append(f"t{i}")
        assert all(len(names) >= 16 for names in by_shard.values()), by_shard
        topics = [t for dsn in shards for t in by_shard[dsn][:4]]
        on = {t: queue.shard_of(queue_namespace, t).dsn for t in topics}
        for number, topic in enumerate(topics):
            plat.bind_queue(f"q{number}", topic, queue_namespace)
            enqueue(queue, queue_namespace, topic,
                    [{"id": number * 1000 + i} for i in range(200)])
        for topic in topics:  # each topic's items live on its shard only
            for dsn in shards:
                with QueueStore(dsn) as store:
                    held = sum(c.ready for c in store.counts(queue_namespace, topic))
                assert held == (200 if dsn == on[topic] else 0), (topic, dsn, held)
        plat.start("scheduler")
        plat.start("tailers")
        want = {number * 1000 + i for number in range(len(topics)) for i in range(200)}
        runs = wait_succeeded(plat, want, 120)
        assert set(runs) == want
    finally:
        plat.stop_all()
        queue.close()
        second.stop()

"""Long work and timeouts that mean what they say, on the real processes and services.

- A Kafka binding whose ``--timeout`` is above its ``--queue-after`` moves its records into
  the queue topic ``<prefix>.moved.<binding>``: the main topic's offsets are committed
  before any function ends, every record runs (with its key and ``topic/partition/offset``
  as ``ctx.key`` / ``ctx.source``), and a record that keeps failing is a dead item of that
  queue topic, listed by ``asynctier queue dead`` and run again by ``queue replay``.
- A sync call past its timeout under ``--isolation process`` is stopped (its worker
  process killed: it never returns) and retried; under threads it is reported, and its
  concurrency slot stays taken until the call returns.

The functions (``tests.funcs.long_work``) append ``id attempt epoch S|D pid source key`` to
a ledger. CI runs seconds-long variants; the 2-minute, 50-record run is ``--long``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asynctier.platform.config import Settings
from asynctier.queue.items import NewItem
from asynctier.queue.store import QueueStore
from tests.helpers import wait_until
from tests.platform_harness import Platform, committed_vs_end, produce_json

WORK = "tests.funcs.long_work:work"
ASYNC_WORK = "tests.funcs.long_work:async_work"


@dataclass(frozen=True)
class Line:
    """One ledger line."""

    id: int
    attempt: int
    at: float
    kind: str
    pid: int
    source: str
    key: str


def ledger(plat: Platform) -> list[Line]:
    """Every whole line of the platform's ledger."""
    if not plat.ledger.exists():
        return []
    lines = []
    for text in plat.ledger.read_text().splitlines():
        parts = text.split(" ")
        if len(parts) == 7:
            lines.append(Line(int(parts[0]), int(parts[1]), float(parts[2]), parts[3],
                              int(parts[4]), parts[5], parts[6]))
    return lines


def done_ids(plat: Platform) -> set[int]:
    """Ids with a successful call."""
    return {line.id for line in ledger(plat) if line.kind == "D"}


@pytest.fixture
def plat(settings: Settings, tmp_path: Path, postgres: str) -> Iterator[Platform]:
    platform = Platform(settings, tmp_path, allow=("tests.funcs",),
                        env={"ASYNCTIER_QUEUE_SHARDS": postgres})
    try:
        yield platform
    finally:
        platform.stop_all()


def enqueue(store: QueueStore, namespace: str, topic: str, docs: list[dict[str, Any]]) -> None:
    """Each doc as one queue item, id its ``id``."""
    store.enqueue(namespace, [NewItem(topic, json.dumps(d).encode(), id=str(d["id"]))
                              for d in docs])


def commit_time(settings: Settings, group: str, topic: str, timeout_s: float) -> float:
    """When the group's committed offsets first reached the topic's end."""
    def caught_up() -> bool:
        committed, end = committed_vs_end(settings, group, topic)
        return end > 0 and committed == end

    wait_until(caught_up, timeout_s, "the main topic's offsets committed to its end",
               interval=0.2)
    return time.time()


def moved_run(plat: Platform, settings: Settings, unique: Any, n: int, function: str,
              sleep_s: float, timeout: str, queue_after: str,
              *extra: str) -> tuple[float, float]:
    """Bind a Kafka topic with long work, produce ``n`` records sleeping ``sleep_s``; when
    the records were produced (all confirmed), and when the main topic was committed to
    its end."""
    topic = unique(partitions=2)
    plat.cli("bind", "long", "--topic", topic, "--function", function, "--timeout", timeout,
             "--queue-after", queue_after, "--lease", "2s", *extra)
    plat.start("scheduler")
    plat.start("tailers")
    wait_until(lambda: "binding long: assigned" in plat.log("tailers", 10**6), 60,
               "the mover's partitions assigned")
    docs = [{"id": i, "sleep": sleep_s} for i in range(n)]
    produce_json(settings, topic, docs, key_of="id")
    produced = time.time()
    return produced, commit_time(settings, settings.names.group("long"), topic, 30)


def assert_no_poll_interval_rebalance(plat: Platform) -> None:
    """Neither process left its group for being too slow between polls."""
    for name in ("tailers", "scheduler"):
        text = plat.log(name, 10**7)
        assert "max.poll.interval" not in text and "MAX_POLL_EXCEEDED" not in text, name


def test_long_kafka_work_moves_to_the_queue_and_commits_at_once(
        plat: Platform, settings: Settings, unique_topic: Any) -> None:
    """20 records of a 2 s function, timeout 3s over a 2s --queue-after: the offsets are
    committed before the first call ends; all 20 run once, each with its own key and
    origin; `asynctier bindings` names the queue path."""
    produced, committed_at = moved_run(plat, settings, unique_topic, 20, WORK, 2.0, "3s",
                                       "2s")
    assert committed_at - produced < 10
    wait_until(lambda: done_ids(plat) == set(range(20)), 60, "all 20 ran", interval=0.5)
    lines = ledger(plat)
    first_done = min(line.at for line in lines if line.kind == "D")
    assert committed_at < first_done, (committed_at, first_done)
    starts = [line for line in lines if line.kind == "S"]
    assert sorted(line.id for line in starts) == list(range(20))  # each ran once
    for line in starts:
        topic, partition, offset = line.source.rsplit("/", 2)
        assert topic.endswith(".topic0") and partition.isdigit() and offset.isdigit()
        assert line.key == str(line.id)
    shown = plat.cli("bindings", "--json").stdout
    [doc] = json.loads(shown)
    assert doc["path"].endswith(f"-> queue default/{settings.names.moved_topic('long')}")
    assert_no_poll_interval_rebalance(plat)


def test_moved_dead_letters_are_dead_items_listed_and_replayed(
        plat: Platform, settings: Settings, unique_topic: Any) -> None:
    """A moved record that keeps failing is a dead item of the moved queue topic (reason
    max_attempts); `queue dead` lists it and `queue replay` runs it again once fixed."""
    topic = unique_topic()
    plat.cli("bind", "long", "--topic", topic, "--function", WORK, "--timeout", "3s",
             "--queue-after", "2s", "--lease", "2s", "--max-attempts", "2",
             "--retry-ladder", "1s")
    plat.start("scheduler")
    plat.start("tailers")
    produce_json(settings, topic, [{"id": 0}, {"id": 1, "until_fixed": True}])
    moved = settings.names.moved_topic("long")

    def dead() -> list[dict[str, Any]]:
        out = plat.cli("queue", "dead", moved, "--namespace", "default", "--json").stdout
        return list(json.loads(out))

    [item] = wait_until(dead, 60, "the failing record dead in the moved queue topic")
    assert item["id"].startswith(f"{topic}/0/") and item["reason"] == "max_attempts"
    assert done_ids(plat) == {0}
    (plat.ledger.parent / (plat.ledger.name + ".fixed")).touch()
    plat.cli("queue", "replay", moved, "--namespace", "default")
    wait_until(lambda: done_ids(plat) == {0, 1}, 30, "the replayed record ran")


def test_sync_overrun_under_process_isolation_is_stopped_and_retried(
        plat: Platform, queue_store: QueueStore, queue_namespace: str) -> None:
    """A sync call that would sleep 30 s past a 1 s timeout is killed (never returns) and
    its retry runs and succeeds; the worker process was replaced (another pid)."""
    plat.cli("bind", "iso", "--queue", "jobs", "--tenant", queue_namespace, "--function",
             WORK, "--timeout", "1s", "--isolation", "process", "--retry-ladder", "1s",
             "--lease", "2s")
    plat.start("scheduler")
    plat.start("tailers")
    enqueue(queue_store, queue_namespace, "jobs", [{"id": 0, "sleep_first": 30}])
    wait_until(lambda: done_ids(plat) == {0}, 30, "the retry succeeded")
    lines = ledger(plat)
    [first] = [ln for ln in lines if ln.attempt == 1 and ln.kind == "S"]
    [second] = [ln for ln in lines if ln.attempt == 2 and ln.kind == "S"]
    assert not [ln for ln in lines if ln.attempt == 1 and ln.kind == "D"]  # stopped
    assert first.pid != second.pid  # the killed worker was replaced
    assert second.at - first.at < 10  # 1 s timeout + 1 s ladder (+ process start)
    log = plat.log("scheduler", 10**6)
    assert "ran past its 1s timeout in worker process" in log and "killed" in log


def _pool_outcome(function: str, allow: list[str], env_ledger: Path) -> Any:
    """Run one item of ``function`` in a real worker process of a ProcessPool allowing
    ``allow`` only; its outcome."""
    import asyncio
    import os

    from asynctier.platform.binding import Binding
    from asynctier.platform.scheduler.processes import ProcessPool

    binding = Binding("iso", "t", function, isolation="process", timeout_s=10)

    @dataclass(frozen=True)
    class _Job:
        binding: Binding
        binding_bytes: bytes

    item: Any = {"id": 7, "binding": "iso", "payload": b'{"id": 7}', "key": b"k",
                 "headers": [], "attempt": 1, "source_ref": "t/0/7", "record_time_ms": 0,
                 "priority": 0, "deadline_ms": None}
    os.environ["ASYNCTIER_TEST_LEDGER"] = str(env_ledger)
    os.environ.pop("ASYNCTIER_TEST_EVIL_IMPORTED", None)

    async def run() -> Any:
        pool = ProcessPool(allow, size=1)
        try:
            return await pool.run_item(_Job(binding, binding.encode()), item)
        finally:
            pool.close()
            await pool.wait_closed()

    return asyncio.run(run())


def test_worker_processes_run_only_allowed_modules(tmp_path: Path) -> None:
    """A worker process of the pool checks the allowed modules before it imports anything,
    as the scheduler does: an allowed function runs (with its ctx), one of a module not
    allowed is a function_error and its module is never imported."""
    ledger_path = tmp_path / "ledger.txt"
    good = _pool_outcome(WORK, ["tests.funcs.long_work"], ledger_path)
    assert good["status"] == "ok" and good["id"] == 7
    assert " t/0/7 k" in ledger_path.read_text()
    refused = _pool_outcome("tests.funcs.evil:run", ["tests.funcs.long_work"], ledger_path)
    assert refused["status"] == "failed" and refused["reason"] == "function_error"
    assert "not allowed" in refused["error"]


def test_sync_overrun_under_threads_is_reported_and_keeps_its_slot(
        plat: Platform, queue_store: QueueStore, queue_namespace: str) -> None:
    """Under threads, with --concurrency 1: item 0 sleeps 4 s past a 1 s timeout. The
    attempt fails at once (reason timeout, logged with binding and item), but item 1 does
    not start until item 0's thread has returned: the slot was not counted free."""
    plat.cli("bind", "thr", "--queue", "jobs", "--tenant", queue_namespace, "--function",
             WORK, "--timeout", "1s", "--concurrency", "1", "--retry-ladder", "30s",
             "--lease", "2s")
    plat.start("scheduler")
    plat.start("tailers")
    enqueue(queue_store, queue_namespace, "jobs", [{"id": 0, "sleep_first": 4}, {"id": 1}])
    wait_until(lambda: 1 in done_ids(plat) and 0 in {ln.id for ln in ledger(plat)
                                                    if ln.kind == "D"},
               30, "item 1 ran and item 0's late call returned")
    lines = ledger(plat)
    [late_return] = [ln for ln in lines if ln.id == 0 and ln.attempt == 1 and ln.kind == "D"]
    [start_1] = [ln for ln in lines if ln.id == 1 and ln.kind == "S"]
    assert start_1.at >= late_return.at, (start_1.at, late_return.at)
    log = plat.log("scheduler", 10**6)
    assert f"binding thr: item queue/{queue_namespace}/jobs/0 (attempt 1)" in log
    assert "a thread cannot be stopped" in log
    info = queue_store.get(queue_namespace, "jobs", "0")
    assert info is not None and "timed out after 1s" in info.last_error  # a failed attempt


@pytest.mark.slow
def test_two_minute_kafka_work_over_50_records(
        plat: Platform, settings: Settings, unique_topic: Any) -> None:
    """The issue's run: 50 records of a 2-minute (async) function. The main topic is
    committed within seconds; all 50 run once; no max.poll.interval rebalance."""
    produced, committed_at = moved_run(plat, settings, unique_topic, 50, ASYNC_WORK,
                                       120.0, "3m", "60s")
    first_start = wait_until(lambda: min((ln.at for ln in ledger(plat) if ln.kind == "S"),
                                         default=0), 60, "a call started")
    print(f"committed {committed_at - produced:.1f}s after the 50 records were produced; "
          f"first call started {first_start - produced:.1f}s after")
    assert committed_at - produced < 10
    wait_until(lambda: done_ids(plat) == set(range(50)), 900, "all 50 ran", interval=2)
    lines = ledger(plat)
    assert sorted(ln.id for ln in lines if ln.kind == "S") == list(range(50))
    assert committed_at < min(ln.at for ln in lines if ln.kind == "D")
    print(f"all 50 done {time.time() - produced:.1f}s after they were produced")
    assert_no_poll_interval_rebalance(plat)

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

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import CheckpointError
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


def moved_run(plat: Platform, settings: Settings, unique: Any, docs: list[dict[str, Any]],
              function: str, timeout: str, queue_after: str,
              *extra: str) -> tuple[float, float]:
    """Bind a Kafka topic with long work and produce ``docs`` (key: their id); when the
    records were produced (all confirmed), and when the main topic was committed to its
    end."""
    topic = unique(partitions=2)
    plat.cli("bind", "long", "--topic", topic, "--function", function, "--timeout", timeout,
             "--queue-after", queue_after, "--lease", "2s", *extra)
    plat.start("scheduler")
    plat.start("tailers")
    wait_until(lambda: "binding long: assigned" in plat.log("tailers", 10**6), 60,
               "the mover's partitions assigned")
    produce_json(settings, topic, docs, key_of="id")
    produced = time.time()
    return produced, commit_time(settings, settings.names.group("long"), topic, 30)


def assert_no_poll_interval_rebalance(plat: Platform) -> None:
    """Neither process left its group for being too slow between polls."""
    for name in ("tailers", "scheduler"):
        text = plat.log(name, 10**7)
        assert "max.poll.interval" not in text and "MAX_POLL_EXCEEDED" not in text, name


def cli(plat: Platform, *args: str) -> str:
    """Run one ``asynctier`` command in this process (a new Python per command costs
    seconds on a busy machine) with the platform's environment; its output."""
    from click.testing import CliRunner

    from asynctier.cli import main

    result = CliRunner().invoke(main, list(args), env=plat.env(), catch_exceptions=False)
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


@dataclass(frozen=True)
class Shared:
    """One platform for the short tests (process starts are most of their time): the
    moved Kafka binding ``long`` on ``topic``, and the queue bindings ``iso`` (process
    isolation) and ``thr`` (threads, concurrency 1) in namespace ``ns``."""

    plat: Platform
    settings: Settings
    topic: str
    ns: str


@pytest.fixture(scope="module")
def shared(kafka_bootstrap: str, redis_url: str, postgres: str, kafka_admin: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    from confluent_kafka.admin import NewTopic

    prefix = "t" + uuid.uuid4().hex[:10]
    settings = Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                        prefix=prefix)
    topic = f"{prefix}.long"
    kafka_admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)],
                              operation_timeout=30)[topic].result(timeout=30)
    plat = Platform(settings, tmp_path_factory.mktemp("long_work"), allow=("tests.funcs",),
                    env={"ASYNCTIER_QUEUE_SHARDS": postgres})
    try:
        cli(plat, "bind", "long", "--topic", topic, "--function", WORK, "--timeout", "3s",
                 "--queue-after", "2s", "--lease", "2s", "--max-attempts", "2",
                 "--retry-ladder", "1s")
        cli(plat, "bind", "iso", "--queue", "iso-jobs", "--tenant", prefix, "--function",
                 WORK, "--timeout", "1s", "--isolation", "process", "--retry-ladder", "1s",
                 "--lease", "2s")
        cli(plat, "bind", "thr", "--queue", "thr-jobs", "--tenant", prefix, "--function",
                 WORK, "--timeout", "1s", "--concurrency", "1", "--retry-ladder", "30s",
                 "--lease", "2s")
        plat.start("scheduler")
        plat.start("tailers")
        wait_until(lambda: "binding long: assigned" in plat.log("tailers", 10**6), 60,
                   "the mover's partitions assigned")
        yield Shared(plat, settings, topic, prefix)
    finally:
        plat.stop_all()
        kafka_admin.delete_topics([topic], operation_timeout=0)


def test_long_kafka_work_moves_to_the_queue_and_commits_at_once(
        shared: Shared, queue_store: QueueStore) -> None:
    """20 records of a 1 s function, timeout 3s over a 2s --queue-after: the offsets are
    committed within seconds and before the first call ends; all 20 run once, each with
    its own key and origin; `asynctier bindings` names the queue path. A 21st record that
    keeps failing is a dead item of the moved queue topic (reason max_attempts): `queue
    dead` lists it and `queue replay` runs it again once its bug is fixed."""
    plat, settings = shared.plat, shared.settings
    docs: list[dict[str, Any]] = [{"id": i, "sleep": 1.0} for i in range(20)]
    docs.append({"id": 20, "until_fixed": True})
    produce_json(settings, shared.topic, docs, key_of="id")
    produced = time.time()
    committed_at = commit_time(settings, settings.names.group("long"), shared.topic, 30)
    assert committed_at - produced < 10
    wait_until(lambda: set(range(20)) <= done_ids(plat), 90, "all 20 ran", interval=0.5)
    lines = [line for line in ledger(plat) if line.id <= 20]
    first_done = min(line.at for line in lines if line.kind == "D")
    assert committed_at < first_done, (committed_at, first_done)
    starts = [line for line in lines if line.kind == "S" and line.id < 20]
    assert sorted(line.id for line in starts) == list(range(20))  # each ran once
    for line in starts:
        topic, partition, offset = line.source.rsplit("/", 2)
        assert topic == shared.topic and partition in ("0", "1") and offset.isdigit()
        assert line.key == str(line.id)
    moved = settings.names.moved_topic("long")
    [doc] = [d for d in json.loads(cli(plat, "bindings", "--json"))
             if d["name"] == "long"]
    assert doc["path"] == f"{shared.topic} -> queue default/{moved}"
    wait_until(lambda: queue_store.dead_items("default", moved), 60,
               "the failing record dead in the moved queue topic")
    [item] = json.loads(cli(plat, "queue", "dead", moved, "--json"))
    assert item["id"].startswith(f"{shared.topic}/") and item["reason"] == "max_attempts"
    assert 20 not in done_ids(plat)
    (plat.ledger.parent / (plat.ledger.name + ".fixed")).touch()
    cli(plat, "queue", "replay", moved)
    wait_until(lambda: 20 in done_ids(plat), 60, "the replayed record ran")
    assert_no_poll_interval_rebalance(plat)


def test_sync_overruns_stopped_under_processes_reported_under_threads(
        shared: Shared, queue_store: QueueStore) -> None:
    """Timeout 1s. Under --isolation process, a call that would sleep 30 s is killed (it
    never returns) and its retry runs in a new worker and succeeds. Under threads with
    --concurrency 1, item 110 sleeps 4 s: its attempt fails at once (reason timeout,
    logged with binding and item), but item 111 does not start until item 110's thread has
    returned: the slot was not counted free."""
    plat, ns = shared.plat, shared.ns
    enqueue(queue_store, ns, "iso-jobs", [{"id": 100, "sleep_first": 30}])
    enqueue(queue_store, ns, "thr-jobs", [{"id": 110, "sleep_first": 4}, {"id": 111}])

    def finished() -> bool:
        late = any(ln.id == 110 and ln.attempt == 1 and ln.kind == "D"
                   for ln in ledger(plat))
        return late and {100, 111} <= done_ids(plat)

    wait_until(finished, 90, "the isolated retry succeeded, item 111 ran and item 110's "
               "late call returned")
    lines = ledger(plat)
    log = plat.log("scheduler", 10**6)
    # --isolation process: stopped and retried in a new worker
    [first] = [ln for ln in lines if ln.id == 100 and ln.attempt == 1 and ln.kind == "S"]
    [second] = [ln for ln in lines if ln.id == 100 and ln.attempt == 2 and ln.kind == "S"]
    assert not [ln for ln in lines if ln.id == 100 and ln.attempt == 1 and ln.kind == "D"]
    assert first.pid != second.pid  # the killed worker was replaced
    assert second.at - first.at < 30  # 1 s timeout + 1 s ladder + a new worker's start
    assert f"binding iso: item queue/{ns}/iso-jobs/100 (attempt 1) ran past its 1s " \
           "timeout in worker process" in log
    # threads: reported, and the slot stays taken while the late call runs
    [late] = [ln for ln in lines if ln.id == 110 and ln.attempt == 1 and ln.kind == "D"]
    [start_111] = [ln for ln in lines if ln.id == 111 and ln.kind == "S"]
    assert start_111.at >= late.at, (start_111.at, late.at)
    assert f"binding thr: item queue/{ns}/thr-jobs/110 (attempt 1)" in log
    assert "a thread cannot be stopped" in log
    info = queue_store.get(ns, "thr-jobs", "110")
    assert info is not None and "timed out after 1s" in info.last_error  # a failed attempt


def _pool_outcomes(functions: list[str], allow: list[str], **extra: Any) -> list[Any]:
    """Run one item of each of ``functions`` in a real worker process of a ProcessPool of
    one worker, allowing ``allow`` only; their outcomes. ``extra``: more item fields (the
    scheduler's ``resumed`` and ``saver``)."""
    from asynctier.platform.binding import Binding
    from asynctier.scheduler.processes import ProcessPool

    @dataclass(frozen=True)
    class _Job:
        binding: Binding
        binding_bytes: bytes

    item: Any = {"id": 7, "binding": "iso", "payload": b'{"id": 7}', "key": b"k",
                 "headers": [], "attempt": 1, "source_ref": "t/0/7", "record_time_ms": 0,
                 "priority": 0, "deadline_ms": None, **extra}

    async def run() -> list[Any]:
        pool = ProcessPool(allow, size=1)
        try:
            results = []
            for function in functions:
                binding = Binding("iso", Source("kafka", "t"), function,
                                  execution=Execution(isolation="process", timeout_s=10))
                results.append(await pool.run_item(_Job(binding, binding.encode()), item))
            return results
        finally:
            pool.close()
            await pool.wait_closed()

    return asyncio.run(run())


def test_worker_processes_run_only_allowed_modules(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process of the pool checks the allowed modules before it imports anything,
    as the scheduler does: an allowed function runs (with its ctx), one of a module not
    allowed is a function_error and is never run."""
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv("ASYNCTIER_TEST_LEDGER", str(ledger_path))
    good, refused = _pool_outcomes([WORK, "tests.funcs.evil:run"], ["tests.funcs.long_work"])
    assert good["status"] == "ok" and good["id"] == 7
    assert " t/0/7 k" in ledger_path.read_text()
    assert refused["status"] == "failed" and refused["reason"] == "function_error"
    assert "not allowed" in refused["error"]


class _Saves:
    """A scheduler-side saver (the stream's StreamSaver stands here): records the states,
    or refuses them as a lost lease would."""

    def __init__(self, refuse: bool = False) -> None:
        self.saved: list[tuple[bytes, str]] = []
        self.refuse = refuse

    def save(self, state: bytes, kind: str) -> None:
        raise AssertionError("a worker's checkpoint is saved from the event loop")

    async def asave(self, state: bytes, kind: str) -> None:
        if self.refuse:
            raise CheckpointError("binding iso: the checkpoint was not saved: lease lost")
        self.saved.append((state, kind))


def test_checkpoints_cross_the_worker_process_pipe(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --isolation process, ctx.resumed reaches the worker and each ctx.checkpoint is
    saved by the scheduler before it returns; a refused save raises in the function."""
    monkeypatch.setenv("ASYNCTIER_TEST_LEDGER", str(tmp_path / "ledger.txt"))
    fn = "tests.funcs.long_work:checkpointing"
    saves = _Saves()
    [done] = _pool_outcomes([fn], ["tests.funcs.long_work"], resumed={"step": 3},
                            saver=saves)
    assert done["status"] == "ok", done
    assert saves.saved == [(b'{"step":4}', "json"), (b'{"step":5}', "json")]
    [refused] = _pool_outcomes([fn], ["tests.funcs.long_work"], saver=_Saves(refuse=True))
    assert refused["status"] != "ok" and "lease lost" in refused["error"], refused


def test_items_of_a_slow_function_get_chunks_of_one() -> None:
    """Once a binding's items are measured at the chunk target or slower, each runs in a
    chunk of its own: a sync function's items would otherwise run one after another in
    one worker thread (eight 2-minute calls in 16 minutes); faster ones keep the floor."""
    from asynctier.scheduler.sizing import ChunkSizer

    sizer = ChunkSizer(target_s=0.02, min_items=8)
    sizer.observe("long", 120.0, 1)
    assert sizer.size("long") == 1
    assert [len(c) for c in sizer.split("long", list(range(50)), spread=8)] == [1] * 50
    sizer.observe("quick", 0.001, 1)
    assert sizer.size("quick") == 20


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 50 two-minute items, 8 at a time per scheduler (one a worker)
def test_two_minute_kafka_work_over_50_records(
        plat: Platform, settings: Settings, unique_topic: Any) -> None:
    """The issue's run: 50 records of a 2-minute (async) function. The main topic is
    committed within seconds; all 50 run once; no max.poll.interval rebalance."""
    produced, committed_at = moved_run(plat, settings, unique_topic,
                                       [{"id": i, "sleep": 120.0} for i in range(50)],
                                       ASYNC_WORK, "3m", "60s")
    print(f"committed {committed_at - produced:.1f}s after the 50 records were produced")
    assert committed_at - produced < 10
    wait_until(lambda: done_ids(plat) == set(range(50)), 900, "all 50 ran", interval=2)
    lines = ledger(plat)
    assert sorted(ln.id for ln in lines if ln.kind == "S") == list(range(50))
    assert committed_at < min(ln.at for ln in lines if ln.kind == "D")
    print(f"all 50 done {time.time() - produced:.1f}s after they were produced")
    assert_no_poll_interval_rebalance(plat)

"""Schedules on a real PostgreSQL: the store (the SDK), firing each tick exactly once from
two processes (one SIGKILLed and restarted), catch-up after an outage, a clock ahead, a
pause mid-tick, a broken stored row, and the CLI refusing bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from asynctier.cli import main
from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Payload, Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue.shards import ShardedQueue
from asynctier.schedules import Schedule, ScheduleStore
from asynctier.schedules.fire import fire_due
from asynctier.schedules.loop import ScheduleLoop
from tests.helpers import wait_until

TOPIC = "ticks"


@pytest.fixture
def queue(postgres: str) -> Iterator[ShardedQueue]:
    with ShardedQueue([postgres], pool_size=4) as q:
        q.stores[0].migrate()
        yield q


@pytest.fixture
def schedules(queue: ShardedQueue, queue_namespace: str) -> Iterator[ScheduleStore]:
    store = ScheduleStore(queue)
    yield store
    for info in store.list(queue_namespace):  # other tests' tailers would fire them
        store.remove(queue_namespace, info.name)


def every(ns: str, name: str, seconds: int = 1, **kw: object) -> Schedule:
    return Schedule(namespace=ns, name=name, topic=TOPIC, every_s=seconds,
                    **kw)  # type: ignore[arg-type]


def db_now_ms(queue: ShardedQueue) -> int:
    with psycopg.connect(queue.stores[0].dsn) as conn:
        row = conn.execute("SELECT asynctier_queue_now_ms()").fetchone()
    assert row is not None
    return int(row[0])


def wait_db_past(queue: ShardedQueue, t_ms: int) -> None:
    wait_until(lambda: db_now_ms(queue) > t_ms, timeout=30, message=f"db clock past {t_ms}")


def drain(queue: ShardedQueue, ns: str) -> list[dict[str, object]]:
    """Lease and ack every ready tick item; their payloads, with enqueue time."""
    out = []
    while True:
        got = queue.lease(ns, TOPIC, 1000, 30, "test")
        if not got:
            return out
        for item in got:
            doc = json.loads(item.payload)
            doc["enqueued_ms"] = item.enqueued_ms
            out.append(doc)
        queue.resolve(ns, TOPIC, "test", acks=[i.id for i in got])


def test_the_store_adds_lists_pauses_resumes_and_removes(
        schedules: ScheduleStore, queue_namespace: str) -> None:
    ns = queue_namespace
    info = schedules.add(every(ns, "cleanup", 300, payload='{"what": "tmp"}'))
    assert (info.state, info.version, info.fired) == ("active", 1, 0)
    assert info.next_ms % 300_000 == 0 and 0 < info.next_ms - info.now_ms <= 300_000
    with pytest.raises(Exception, match="exists in namespace"):
        schedules.add(every(ns, "cleanup", 60))
    replaced = schedules.add(every(ns, "cleanup", 60), replace=True)
    assert replaced.version == 2 and replaced.schedule == every(ns, "cleanup", 60)
    assert schedules.pause(ns, "cleanup").state == "paused"
    assert schedules.resume(ns, "cleanup").state == "active"
    assert [i.name for i in schedules.list(ns)] == ["cleanup"]
    assert schedules.remove(ns, "cleanup") and schedules.get(ns, "cleanup") is None
    assert not schedules.remove(ns, "cleanup")
    with pytest.raises(Exception, match="no schedule 'gone'"):
        schedules.pause(ns, "gone")


def _spawn(env: dict[str, str], ns: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "asynctier", "schedule", "run", "--only", ns, "--poll", "100ms"],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def _consume(queue: ShardedQueue, ns: str, ledger: Path, stop: threading.Event) -> None:
    with ledger.open("a") as out:
        while not stop.is_set():
            for doc in drain(queue, ns):
                out.write(json.dumps([doc["schedule"], doc["tick_ms"], doc["enqueued_ms"]]) + "\n")
                out.flush()
            stop.wait(0.05)


def _check_ledger(ledger: Path, schedules: ScheduleStore, ns: str, names: list[str],
                  step_ms: int) -> list[float]:
    """Each tick once, none missing between each schedule's first and last; lateness."""
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    seen: dict[str, list[int]] = {}
    for name, tick, _ in rows:
        seen.setdefault(name, []).append(tick)
    for name in names:
        ticks = seen[name]
        assert len(ticks) == len(set(ticks)), f"{name}: a tick fired twice"
        ticks.sort()
        assert ticks == list(range(ticks[0], ticks[-1] + 1, step_ms)), f"{name}: a tick missing"
        info = schedules.get(ns, name)
        assert info is not None and info.fired == len(ticks) and info.skipped == 0
        assert info.last_tick_ms == ticks[-1]
    return sorted((enq - tick) / 1000 for _, tick, enq in rows)


def run_two_processes(postgres: str, queue: ShardedQueue, schedules: ScheduleStore, ns: str,
                      tmp_path: Path, count: int, run_s: float, kills: int) -> list[float]:
    """``count`` schedules every 1 s fired by two loop processes for ``run_s``; the first
    SIGKILLed and restarted ``kills`` times. Returns the sorted lateness of every tick."""
    names = [f"s{n:03d}" for n in range(count)]
    env = dict(os.environ, ASYNCTIER_CONFIG="", ASYNCTIER_QUEUE_SHARDS=postgres)
    log, ledger = tmp_path / "loops.log", tmp_path / "ledger.jsonl"
    procs = [_spawn(env, ns, log), _spawn(env, ns, log)]
    stop = threading.Event()
    consumer = threading.Thread(target=_consume, args=(queue, ns, ledger, stop))
    consumer.start()
    try:
        wait_until(lambda: log.read_text().count("schedule loop running") == 2, timeout=60,
                   message="both loop processes running")
        for name in names:
            schedules.add(every(ns, name))
        start = time.monotonic()
        for k in range(kills):
            wait_until(lambda k=k: time.monotonic() - start > run_s * (k + 1) / (kills + 1),
                       timeout=run_s + 30, interval=0.2)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            procs[0] = _spawn(env, ns, log)
            wait_until(lambda k=k: log.read_text().count("schedule loop running") == k + 3,
                       timeout=60, message="the killed loop process restarted")
        wait_until(lambda: time.monotonic() - start > run_s, timeout=run_s + 30, interval=0.2)
        for name in names:
            schedules.pause(ns, name)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)
        stop.set()
        consumer.join(30)
    drain_left = drain(queue, ns)
    assert not drain_left, "the consumer missed items"
    assert all(p.returncode == 0 for p in procs), log.read_text()[-2000:]
    return _check_ledger(ledger, schedules, ns, names, 1000)


def test_each_tick_fires_once_from_two_processes_one_sigkilled(
        postgres: str, queue: ShardedQueue, schedules: ScheduleStore, queue_namespace: str,
        tmp_path: Path) -> None:
    lateness = run_two_processes(postgres, queue, schedules, queue_namespace, tmp_path,
                                 count=20, run_s=8, kills=1)
    assert len(lateness) >= 20 * 5
    assert lateness[0] >= 0, "a tick fired before its time (by the database's clock)"
    assert lateness[int(len(lateness) * 0.99) - 1] < 1.0, lateness[-10:]


@pytest.mark.slow
def test_200_schedules_for_60s_two_processes_one_killed_twice(
        postgres: str, queue: ShardedQueue, schedules: ScheduleStore, queue_namespace: str,
        tmp_path: Path) -> None:
    lateness = run_two_processes(postgres, queue, schedules, queue_namespace, tmp_path,
                                 count=200, run_s=60, kills=2)
    p50, p99 = lateness[len(lateness) // 2], lateness[int(len(lateness) * 0.99) - 1]
    print(f"\n{len(lateness)} ticks fired once each; lateness p50 {p50:.3f}s p99 {p99:.3f}s "
          f"max {lateness[-1]:.3f}s")
    assert lateness[0] >= 0 and p99 < 1.0


def test_catch_up_after_an_outage_none_last_all(
        queue: ShardedQueue, schedules: ScheduleStore, queue_namespace: str) -> None:
    ns = queue_namespace
    for policy in ("none", "last", "all"):
        schedules.add(every(ns, policy, catch_up=policy, grace_s=1))
    first = max(i.next_ms for i in schedules.list(ns))
    wait_db_past(queue, first)
    up = fire_due(queue.stores[0], namespaces=[ns])
    # The three were added a moment apart: one may have ticked a second earlier, so the
    # first firing can fire (or skip) two ticks of it. The outage is counted from here.
    assert {name for name, _, _ in up.fired} == {"all", "last", "none"}
    last_fired: dict[str, int] = {}
    for name, tick, _ in up.fired:
        last_fired[name] = max(tick, last_fired.get(name, tick))
    skipped_before = {name: schedules.get(ns, name).skipped  # type: ignore[union-attr]
                      for name in last_fired}
    wait_db_past(queue, first + 5_000)  # the platform is down for five ticks
    back = fire_due(queue.stores[0], namespaces=[ns])
    fired: dict[str, list[int]] = {}
    for name, tick, _ in back.fired:
        fired.setdefault(name, []).append(tick)
    now = back.now_ms
    missed = {name: [t for t in range(last_fired[name] + 1000, now + 1, 1000)
                     if now - t > 1000] for name in last_fired}
    on_time = {name: [t for t in range(last_fired[name] + 1000, now + 1, 1000)
                      if now - t <= 1000] for name in last_fired}
    assert len(missed["none"]) >= 3
    assert fired["none"] == on_time["none"]
    assert fired["last"] == missed["last"][-1:] + on_time["last"]
    assert fired["all"] == missed["all"] + on_time["all"]
    skipped = {name: schedules.get(ns, name).skipped - skipped_before[name]  # type: ignore[union-attr]
               for name in last_fired}
    assert skipped == {"none": len(missed["none"]), "last": len(missed["last"]) - 1, "all": 0}
    ids = {d["tick_ms"] for d in drain(queue, ns) if d["schedule"] == "all"}
    assert ids == {tick for name, tick, _ in up.fired if name == "all"} | set(fired["all"])


def test_a_process_whose_clock_is_30s_ahead_fires_nothing_early(
        queue: ShardedQueue, schedules: ScheduleStore, queue_namespace: str) -> None:
    ns = queue_namespace
    loop = ScheduleLoop(queue, poll_s=0.05, clock=lambda: time.time() + 30, namespaces=[ns])
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,))
    schedules.add(every(ns, "ahead"))
    thread.start()
    try:
        wait_until(lambda: (schedules.get(ns, "ahead").fired >= 3),  # type: ignore[union-attr]
                   timeout=15, message="three ticks fired")
    finally:
        stop.set()
        thread.join(10)
    items = drain(queue, ns)
    assert len(items) >= 3
    assert all(int(d["enqueued_ms"]) >= int(d["tick_ms"]) for d in items), items  # type: ignore[call-overload]
    offset = metrics.SCHEDULE_CLOCK_OFFSET._value.get()
    assert 29 < offset < 31


def test_a_pause_waits_for_a_firing_under_way_and_no_old_version_fires_after(
        queue: ShardedQueue, schedules: ScheduleStore, queue_namespace: str) -> None:
    ns = queue_namespace
    info = schedules.add(every(ns, "edited"))
    wait_db_past(queue, info.next_ms)
    with psycopg.connect(queue.stores[0].dsn) as firing:  # a firing holding the row
        firing.execute("SELECT 1 FROM asynctier_schedules WHERE namespace = %s AND name = %s "
                       "FOR UPDATE", (ns, "edited"))
        assert fire_due(queue.stores[0], namespaces=[ns]).fired == []  # skipped: locked
        paused = threading.Thread(target=schedules.pause, args=(ns, "edited"))
        paused.start()
        wait_until(lambda: _lock_waiters(queue) > 0, timeout=10, message="pause waits")
        assert paused.is_alive()
    paused.join(10)
    assert schedules.get(ns, "edited").state == "paused"  # type: ignore[union-attr]
    wait_db_past(queue, info.next_ms + 1500)
    assert fire_due(queue.stores[0], namespaces=[ns]).fired == []
    replaced = schedules.add(every(ns, "edited", 2, payload='{"v": 2}'), replace=True)
    assert replaced.state == "paused"  # a new definition keeps the schedule's state
    replaced = schedules.resume(ns, "edited")
    wait_db_past(queue, replaced.next_ms)
    done = fire_due(queue.stores[0], namespaces=[ns])
    assert [t for _, t, _ in done.fired] == [replaced.next_ms]
    assert [d.get("v") for d in drain(queue, ns)] == [2]


def _lock_waiters(queue: ShardedQueue) -> int:
    with psycopg.connect(queue.stores[0].dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
    return int(row[0]) if row else 0


def test_a_stored_row_that_is_not_a_schedule_is_paused_with_why(
        queue: ShardedQueue, schedules: ScheduleStore, queue_namespace: str) -> None:
    ns = queue_namespace
    schedules.add(every(ns, "fine"))
    schedules.add(every(ns, "tampered"))
    with psycopg.connect(queue.stores[0].dsn) as conn:
        conn.execute("UPDATE asynctier_schedules SET cron = 'no way', next_ms = 0 "
                     "WHERE namespace = %s AND name = 'tampered'", (ns,))
    done = fire_due(queue.stores[0], namespaces=[ns])
    assert done.broken == ["tampered"]
    info = schedules.get(ns, "tampered")
    assert info is not None and info.state == "broken" and "exactly one of" in info.error
    assert [i.state for i in schedules.list(ns)] == ["active", "broken"]
    with pytest.raises(Exception, match="cannot resume"):
        schedules.resume(ns, "tampered")


@pytest.mark.parametrize(("args", "says"), [
    (["--cron", "*/5 * *"], "give five fields"),
    (["--cron", "0 9 * * *", "--timezone", "Europe/Nowhere"], "is unknown"),
    (["--every", "0s"], "give whole seconds, at least 1s"),
    (["--every", "1.5s"], "give whole seconds, at least 1s"),
    (["--every", "5s", "--payload", "[]"], "give a JSON object"),
])
def test_the_cli_refuses_bad_input_saying_what_to_fix(
        postgres: str, schedules: ScheduleStore, queue_namespace: str, args: list[str],
        says: str) -> None:
    env = {"ASYNCTIER_CONFIG": "", "ASYNCTIER_QUEUE_SHARDS": postgres}
    result = CliRunner().invoke(main, ["schedule", "add", "bad", "-n", queue_namespace,
                                       "--queue", TOPIC, "--unbound", *args], env=env)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert schedules.list(queue_namespace) == []


def test_the_cli_adds_lists_and_shows(postgres: str, queue_namespace: str) -> None:
    env = {"ASYNCTIER_CONFIG": "", "ASYNCTIER_QUEUE_SHARDS": postgres}
    ns = ["-n", queue_namespace]
    run = CliRunner().invoke
    added = run(main, ["schedule", "add", "nightly", *ns, "--cron", "0 3 * * *", "--timezone",
                       "Europe/Paris", "--queue", TOPIC, "--unbound", "--catch-up", "last"],
                env=env)
    assert added.exit_code == 0, added.output
    assert "cron '0 3 * * *' (Europe/Paris)" in added.output
    listed = run(main, ["schedule", "list", *ns, "--json"], env=env)
    assert [d["name"] for d in json.loads(listed.output)] == ["nightly"]
    shown = run(main, ["schedule", "show", "nightly", *ns, "--json"], env=env)
    doc = json.loads(shown.output)
    assert doc["state"] == "active" and doc["catch_up"] == "last" and doc["next"].endswith(
        ":00:00Z")
    assert run(main, ["schedule", "pause", "nightly", *ns], env=env).exit_code == 0
    assert "paused" in run(main, ["schedule", "list", *ns], env=env).output
    assert run(main, ["schedule", "remove", "nightly", *ns], env=env).exit_code == 0
    assert run(main, ["schedule", "show", "nightly", *ns], env=env).exit_code == 1


def test_a_payload_the_bindings_decoder_refuses_is_refused(
        settings: Settings, postgres: str, schedules: ScheduleStore,
        queue_namespace: str) -> None:
    schema = {"type": "record", "name": "Tick", "fields": [{"name": "n", "type": "int"}]}
    BindingRegistry(settings).put(Binding("avro-ticks", Source("queue", "avro-ticks"),
                                          "tests.faults.funcs:run", tenant=queue_namespace,
                                          payload=Payload(format="avro",
                                                          schema=json.dumps(schema))).validate())
    BindingRegistry(settings).put(Binding("json-ticks", Source("queue", "json-ticks"),
                                          "tests.faults.funcs:run",
                                          tenant=queue_namespace).validate())
    env = {"ASYNCTIER_CONFIG": "", "ASYNCTIER_QUEUE_SHARDS": postgres,
           "ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix}
    args = ["schedule", "add", "s", "-n", queue_namespace, "--every", "5s", "--queue"]
    refused = CliRunner().invoke(main, [*args, "avro-ticks"], env=env)
    assert refused.exit_code == 2, refused.output
    assert "reads queue topic 'avro-ticks' as avro and cannot decode" in refused.output
    assert schedules.list(queue_namespace) == []
    unbound = CliRunner().invoke(main, [*args, "nobody-reads"], env=env)
    assert unbound.exit_code == 2 and "no binding reads queue topic" in unbound.output
    fine = CliRunner().invoke(main, [*args, "json-ticks"], env=env)
    assert fine.exit_code == 0, fine.output


def test_a_queue_never_reached_is_waited_for_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A deployment without PostgreSQL (Kafka bindings only): the loop in its tailers waits,
    logs it once, and never fails (its tailers stay ready)."""
    caplog.set_level("INFO", logger="asynctier.schedules.loop")
    with ShardedQueue(["postgresql://x@127.0.0.1:1/none"], pool_size=1, timeout_s=0.5) as q:
        loop = ScheduleLoop(q, poll_s=0.05)
        stop = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                loop.run(stop)
            except Exception as exc:
                failed.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_until(lambda: caplog.text.count("does not answer") == 1, timeout=20)
        finally:
            stop.set()
            thread.join(10)
    assert failed == [] and caplog.text.count("does not answer") == 1

"""Schedules and dependencies: what a firing and a release cost.

1. ``--schedules`` (10,000) schedules ``--every 60s`` all tick at the next minute; two
   ``asynctier schedule run`` processes fire them. Reported: each tick's lateness (its
   item's enqueue time minus the tick, both PostgreSQL's clock) p50/p99/max, and the CPU
   seconds of the two loop processes and of PostgreSQL per firing.
2. Dependency release: one parent with ``--fan-out`` (10,000) children, its ack timed
   (it releases them all) against the ack of a parent with none; and ``--fan-in`` (1,000)
   parents of one child, each ack timed against plain acks.
3. What the release statement costs every resolve, graphs or not: 500 acks resolved as
   shipped against the ACK statement alone, 20 rounds each, interleaved.

    .venv/bin/python -m bench.schedules [--schedules 10000] [--fan-out 10000]

Waits for the next minute's turn (up to a minute). On a shared machine the figures vary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

import psutil
import psycopg

from asynctier.queue import sql as queue_sql
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.queue.store import QueueStore
from asynctier.schedules import Schedule, ScheduleStore
from bench.stack import postgres


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bench_schedules(dsn: str, pg_pid: int | None, count: int) -> None:
    ns = f"b{uuid.uuid4().hex[:8]}"
    with ShardedQueue([dsn], pool_size=4) as queue:
        store = ScheduleStore(queue)
        env = dict(os.environ, ASYNCTIER_CONFIG="", ASYNCTIER_QUEUE_SHARDS=dsn,
                   ASYNCTIER_LOG_LEVEL="WARNING")
        loops = [subprocess.Popen([sys.executable, "-m", "asynctier", "schedule", "run",
                                   "--only", ns], env=env) for _ in range(2)]
        try:
            started = time.monotonic()
            for n in range(count):
                store.add(Schedule(namespace=ns, name=f"s{n:05d}", topic="ticks", every_s=60))
            print(f"added {count} schedules in {time.monotonic() - started:.1f}s")
            tick = store.get(ns, "s00000").next_ms  # type: ignore[union-attr]
            info = store.get(ns, "s00000")
            assert info is not None
            wait_s = (tick - info.now_ms) / 1000
            if wait_s < 5:  # too close to the turn: the adds may straddle it; next minute
                print("too close to the minute's turn; waiting for the next one")
                time.sleep(wait_s + 1)
                tick += 60_000
            else:
                time.sleep(max(0.0, wait_s - 2))
            cpu0 = _cpu([p.pid for p in loops])
            pg0 = _cpu([pg_pid]) if pg_pid else 0.0
            deadline = time.monotonic() + 120
            with psycopg.connect(dsn) as conn:
                while time.monotonic() < deadline:
                    row = conn.execute("SELECT count(*) FROM asynctier_queue_items WHERE "
                                       "namespace = %s AND deliver_after = %s", (ns, tick)
                                       ).fetchone()
                    if row and row[0] >= count:
                        break
                    time.sleep(0.2)
                cpu1 = _cpu([p.pid for p in loops])
                pg1 = _cpu([pg_pid]) if pg_pid else 0.0
                late = [r[0] / 1000 for r in conn.execute(
                    "SELECT enqueued_ms - deliver_after FROM asynctier_queue_items WHERE "
                    "namespace = %s AND deliver_after = %s", (ns, tick)).fetchall()]
        finally:
            for p in loops:
                p.terminate()
            for p in loops:
                p.wait(15)
    print(f"{len(late)} ticks fired at one minute's turn: lateness p50 {_pct(late, 0.5):.3f}s "
          f"p99 {_pct(late, 0.99):.3f}s max {max(late):.3f}s; CPU per firing: loops "
          f"{(cpu1 - cpu0) / len(late) * 1e6:.0f} us, PostgreSQL "
          f"{(pg1 - pg0) / len(late) * 1e6:.0f} us")


def _ack_s(store: QueueStore, ns: str, topic: str, ids: list[str]) -> float:
    got = store.lease(ns, topic, len(ids), 30, "bench")
    assert sorted(i.id for i in got) == sorted(ids), (len(got), len(ids))
    started = time.perf_counter()
    store.resolve(ns, topic, "bench", acks=ids)
    return time.perf_counter() - started


def bench_release(dsn: str, fan_out: int, fan_in: int) -> None:
    ns = f"b{uuid.uuid4().hex[:8]}"
    with QueueStore(dsn, pool_size=2) as store:
        plain = []
        for n in range(5):
            store.enqueue(ns, [NewItem("lonely", b"", id=f"l{n}")])
            plain.append(_ack_s(store, ns, "lonely", [f"l{n}"]))
        store.enqueue(ns, [NewItem("root", b"", id="r")])
        for start in range(0, fan_out, 1000):
            store.enqueue(ns, [NewItem("kids", b"", id=f"k{n}", after=[("root", "r")])
                               for n in range(start, min(fan_out, start + 1000))])
        out_s = _ack_s(store, ns, "root", ["r"])
        ready = store.counts(ns, "kids")[0].ready
        store.enqueue(ns, [NewItem("parents", b"", id=f"p{n}") for n in range(fan_in)])
        store.enqueue(ns, [NewItem("sink", b"", id="s",
                                   after=[("parents", f"p{n}") for n in range(fan_in)])])
        got = store.lease(ns, "parents", fan_in, 30, "bench")
        acks = []
        for item in got:
            started = time.perf_counter()
            store.resolve(ns, "parents", "bench", acks=[item.id])
            acks.append(time.perf_counter() - started)
        sink = store.get(ns, "sink", "s")
    base = statistics.median(plain)
    print(f"fan-out: one ack released {ready} children in {out_s * 1000:.0f} ms "
          f"({(out_s - base) / fan_out * 1e6:.1f} us per child over a plain ack's "
          f"{base * 1000:.1f} ms)")
    median_ms = statistics.median(acks) * 1000
    print(f"fan-in: {fan_in} parents acked one by one: median ack {median_ms:.1f} ms (plain "
          f"{base * 1000:.1f} ms); the child is {sink.state if sink else 'gone'}")


def bench_ack_overhead(dsn: str) -> None:
    ns = f"b{uuid.uuid4().hex[:8]}"
    with QueueStore(dsn, pool_size=2) as store:
        for start in range(0, 20_000, 1000):
            store.enqueue(ns, [NewItem("t", b"{}", id=f"i{n}")
                               for n in range(start, start + 1000)])
        shipped, bare = [], []
        for r in range(40):
            ids = [i.id for i in store.lease(ns, "t", 500, 30, "o")]
            started = time.perf_counter()
            if r % 2 == 0:
                store.resolve(ns, "t", "o", acks=ids)
                shipped.append(time.perf_counter() - started)
            else:
                with store.transaction() as conn:
                    conn.execute(queue_sql.ACK, {"ns": ns, "topic": "t", "owner": "o",
                                                 "ids": ids}).fetchall()
                bare.append(time.perf_counter() - started)
    print(f"a resolve of 500 acks: {statistics.median(shipped) * 1000:.2f} ms with the release "
          f"statement, {statistics.median(bare) * 1000:.2f} ms for the ACK alone (medians)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.schedules", description=__doc__)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--fan-out", type=int, default=10_000)
    parser.add_argument("--fan-in", type=int, default=1_000)
    parser.add_argument("--skip-schedules", action="store_true")
    args = parser.parse_args(argv)
    with postgres() as pg:
        with QueueStore(pg.dsn) as store:
            store.migrate()
        bench_release(pg.dsn, args.fan_out, args.fan_in)
        bench_ack_overhead(pg.dsn)
        if not args.skip_schedules:
            bench_schedules(pg.dsn, pg.pid, args.schedules)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

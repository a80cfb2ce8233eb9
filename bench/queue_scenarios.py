"""The queue drain's contenders (``bench/queue_drain.py``): asynctier's PostgreSQL queue
and Procrastinate, on the same PostgreSQL.

Each scenario fills its queue first (timed: the enqueue throughput), then starts the
consumers and measures, as :func:`bench.measure.watch_drain` does for Kafka, from the
first poll that sees an item done to the poll that sees them all done. Progress is read
with ``count(*)`` on a connection of the benchmark's own (:class:`PgWatch`) every 0.1 s;
that connection's backend is left out of PostgreSQL's CPU.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg

from asynctier.queue import NewItem, QueueStore
from bench import spy
from bench.asynctier_run import COMPONENTS, REPO, AsynctierRun
from bench.measure import BenchError, Drain, Finder, Meter, single, tree, watch_drain
from bench.records import record
from bench.scenarios import IDEMPOTENT_NOTE, Row, platform
from bench.stack import Postgres, Services

NAMESPACE = "bench"
POLL_S = 0.1
PROCRASTINATE_APP = "bench.procrastinate_app.app"
#: asynctier's own processes in an ``asynctier run``.
OWN = ("run", *COMPONENTS)


class PgWatch:
    """The benchmark's own connection: counts, housekeeping between scenarios, and the
    PostgreSQL process group without itself."""

    def __init__(self, pg: Postgres) -> None:
        self.pg = pg
        self.conn = psycopg.connect(pg.dsn, autocommit=True)
        self.backend = self.conn.info.backend_pid

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def scalar(self, query: str, params: tuple[object, ...] = ()) -> int:
        """The first column of the first row of ``query``, as an int."""
        row = self.conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        return int(row[0]) if row and row[0] is not None else 0

    def vacuum(self, *tables: str) -> None:
        """VACUUM ANALYZE ``tables`` (outside every measured window), so that no scenario
        is charged with the autovacuum of the one before it."""
        for table in tables:
            self.conn.execute(f"VACUUM (ANALYZE) {table}")  # type: ignore[arg-type]

    def server(self) -> Finder:
        """PostgreSQL's processes (the postmaster and every backend and worker), without
        this connection's backend."""
        if self.pg.pid is None:
            return lambda: []
        every = tree(self.pg.pid)
        return lambda: [p for p in every() if p.pid != self.backend]


@dataclass(frozen=True)
class Filled:
    """How long filling a queue took."""

    items: int
    seconds: float
    batch: int

    @property
    def rate(self) -> float:
        """Items enqueued per second."""
        return self.items / self.seconds if self.seconds > 0 else 0.0


def _timeout(items: int, per_s: float) -> float:
    return 60.0 + items / per_s


def _services_groups(services: Services, watch: PgWatch) -> dict[str, Finder]:
    groups: dict[str, Finder] = {"postgres": watch.server()}
    if services.kafka_pid is not None:
        groups["kafka"] = single(services.kafka_pid)
    if services.redis_pid is not None:
        groups["redis"] = single(services.redis_pid)
    return groups


def _detail(drain: Drain, keys: tuple[str, ...]) -> dict[str, float]:
    return {f"cpu_s.{k}": drain.cpu_s.get(k, 0.0) for k in keys}


# --------------------------------------------------------------------------- asynctier


def enqueue(dsn: str, topic: str, n: int, batch: int, delay_s: float | None = None) -> Filled:
    """``n`` records (the Kafka scenarios' ~100-byte JSON) into queue topic ``topic``,
    ``batch`` per :meth:`QueueStore.enqueue` call (one statement each), ids made by the
    store; the records are built inside the timed loop, as a producer would. With
    ``delay_s``, each is delivered that long after its enqueue."""
    with QueueStore(dsn, pool_size=1) as store:
        store.migrate()
        started = time.monotonic()
        for first in range(0, n, batch):
            store.enqueue(NAMESPACE, [NewItem(topic, record(i, time.time()), delay_s=delay_s)
                                      for i in range(first, min(n, first + batch))])
        return Filled(n, time.monotonic() - started, batch)


QUEUE_TABLES = ("asynctier_queue_items", "asynctier_queue_dead")


def queue_drain(services: Services, watch: PgWatch, folder: Path, n: int, batch: int,
                idempotent: bool = False,
                profile: dict[str, spy.Profile] | None = None,
                topic: str | None = None, later: bool = False) -> tuple[Row, Filled]:
    """Fill a queue topic (a fresh one unless ``topic`` is given) with ``n`` items, then
    drain it with the default ``asynctier run`` (a binding ``--queue`` to
    ``bench.noop:noop``) until every one is acked. ``later``: the topic also holds items
    due an hour or more from now, which the drain leaves; they are not counted (counting
    a million of them every poll costs PostgreSQL more than the drain). With ``profile``,
    py-spy samples the tailer and scheduler during the drain and their summaries go
    there."""
    topic = topic or f"bench-q-{uuid.uuid4().hex[:6]}"
    filled = enqueue(watch.pg.dsn, topic, n, batch)
    watch.vacuum(*QUEUE_TABLES)
    label = "queue-idem" if idempotent else "queue"
    with platform(services, folder, label, {"ASYNCTIER_QUEUE_SHARDS": watch.pg.dsn}) as run:
        run.bind_queue("qnoop", topic, "noop", "--tenant", NAMESPACE,
                       *(("--idempotent",) if idempotent else ()))
        groups: dict[str, Finder] = {c: run.component(c) for c in COMPONENTS}
        groups["run"] = run.parent()
        groups.update(_services_groups(services, watch))
        meter = Meter(groups)
        left = ("SELECT count(*) FROM asynctier_queue_items WHERE namespace = %s "
                "AND topic = %s" + (" AND priority = 0 AND deliver_after < "  # the lease index
                                    "asynctier_queue_now_ms() + 3600000" if later else ""))
        spies = _Spies(run, folder, label) if profile is not None else None

        def done() -> int:
            got = n - watch.scalar(left, (NAMESPACE, topic))
            if spies is not None and got > 0:
                spies.attach()
            return got

        run.start()
        try:
            drain = watch_drain(done, n, meter, _timeout(n, 500), POLL_S, check=run.check())
        finally:
            if spies is not None and profile is not None:
                profile.update(spies.stop())
        dead = watch.scalar("SELECT count(*) FROM asynctier_queue_dead WHERE namespace = %s "
                            "AND topic = %s", (NAMESPACE, topic))
    if dead:
        raise BenchError(f"{dead} items of {topic} went to the dead items: see {run.log}")
    name = "asynctier queue, no-op" + (" bound --idempotent" if idempotent else
                                       " (default binding: run-once guard)")
    return _queue_row(name, drain, IDEMPOTENT_NOTE if idempotent else ""), filled


#: The River bench program's Go module (``bench/river``).
RIVER = Path(__file__).resolve().parent / "river"


def build_river(folder: Path) -> Path:
    """The River bench program, built from ``bench/river`` (go.mod and go.sum pinned)."""
    out = folder / "river-bench"
    subprocess.run(["go", "build", "-mod=readonly", "-o", str(out), "."], cwd=RIVER,
                   check=True, env={**os.environ, "CGO_ENABLED": "0"})
    return out


def river(program: Path, mode: str, dsn: str, *args: str) -> dict[str, Any]:
    """One run of the River program; its JSON answer."""
    done = subprocess.run([str(program), mode, "-dsn", dsn, *args], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "GOMAXPROCS": "2"})
    if done.returncode != 0:
        raise RuntimeError(f"river-bench {mode} failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def river_drain(program: Path, dsn: str, n: int, batch: int, workers: int) -> tuple[Row, Filled]:
    """River's ``InsertManyFast`` of ``n`` no-op jobs (``batch`` a call), then its client's
    drain of them (``bench/river``: rates only, its CPU is not metered)."""
    got = river(program, "drain", dsn, "-jobs", str(n), "-batch", str(batch),
                "-workers", str(workers))
    drain_s, insert_s = n / float(got["drain_per_s"]), n / float(got["insert_per_s"])
    return (Row("River", n, drain_s, float("nan"), None, {}, RIVER_NOTE),
            Filled(n, insert_s, batch))


RIVER_NOTE = ("River v0.51.2 (Go, pgx driver, its schema migrated by its own migrator), "
              "MaxWorkers --river-workers, GOMAXPROCS 2, FetchCooldown 2 ms, "
              "FetchPollInterval 20 ms (River's own benchmark's settings); no run-once guard")


def asynctier_pickup(svc: Services, pg: Postgres, folder: Path, n: int,
                     rate: float | None) -> dict[str, float]:
    """p50/p99 ms from just before each single enqueue to its function's start, through a
    default ``asynctier run``: random idle gaps, or ``rate`` a second."""
    topic = f"bench-pick-{uuid.uuid4().hex[:6]}"
    samples = folder / f"{topic}.samples"
    env = {"ASYNCTIER_QUEUE_SHARDS": pg.dsn, "BENCH_LATENCY_FILE": str(samples)}
    rng = random.Random(7)
    with platform(svc, folder, "pickup", env) as run, QueueStore(pg.dsn, pool_size=1) as store:
        run.bind_queue("qpick", topic, "timed", "--tenant", NAMESPACE, "--idempotent")
        run.start()

        def left() -> int:
            return sum(c.ready + c.leased + c.delayed for c in store.counts(NAMESPACE, topic))

        store.enqueue(NAMESPACE, [NewItem(topic, json.dumps({"t0": time.time(),
                                                                "warmup": True}).encode())])
        deadline = time.monotonic() + 60
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(n):
            time.sleep(1 / rate if rate else rng.uniform(0.02, 0.2))
            store.enqueue(NAMESPACE, [NewItem(topic, json.dumps({"t0": time.time()}
                                                                   ).encode())])
        deadline = time.monotonic() + 60
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
    ms = sorted(float(line.split()[1]) for line in samples.read_text().splitlines())
    if len(ms) < n:
        raise BenchError(f"asynctier pickup: {len(ms)} of {n} items started; see {run.log}")
    return {"p50": ms[len(ms) // 2], "p99": ms[min(len(ms) - 1, len(ms) * 99 // 100)]}


def _queue_row(name: str, drain: Drain, note: str) -> Row:
    cpu = sum(drain.cpu_s.get(k, 0.0) for k in OWN)
    rss = {k: drain.peak_rss.get(k, 0) for k in ("tailers", "scheduler")}
    return Row(name, drain.items, drain.seconds, cpu, drain.cpu_s.get("postgres"), rss, note,
               _detail(drain, (*OWN, "postgres", "redis", "kafka")))


class _Spies:
    """py-spy on the tailer and scheduler of ``run``, attached once items are done."""

    def __init__(self, run: AsynctierRun, folder: Path, label: str) -> None:
        exe = spy.py_spy()
        if exe is None:
            raise BenchError("py-spy is not installed (pip install -e .[bench])")
        self.exe = exe
        self.run = run
        self.files = {t: folder / f"profile-{label}-{t}.txt" for t in spy.TARGETS}
        self.spies: dict[str, subprocess.Popen[bytes]] = {}

    def attach(self) -> None:
        if self.spies:
            return
        for target, pid in spy._wait_pids(self.run).items():
            if target in spy.TARGETS:
                self.spies[target] = subprocess.Popen(
                    [self.exe, "record", "--pid", str(pid), "--rate", "250", "--format",
                     "raw", "--gil", "--output", str(self.files[target]), "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, spy.Profile]:
        spy._stop_spies(self.spies)
        shares: dict[str, list[spy.Share]] = {}
        samples: dict[str, int] = {}
        for target, path in self.files.items():
            text = path.read_text() if path.exists() else ""
            shares[target], samples[target] = spy.summarize(text)
        return {"queue": spy.Profile(shares, samples, self.files)}


# --------------------------------------------------------------------------- Procrastinate


@dataclass(frozen=True)
class PeerSettings:
    """How Procrastinate's workers run."""

    workers: int = 2
    concurrency: int = 1
    task: str = "noop"

    def describe(self) -> str:
        """The settings in words, for the results."""
        return (f"{self.workers} worker processes, --concurrency {self.concurrency}, "
                f"task {self.task} ({'async def' if self.task.endswith('async') else 'def'})"
                ", delete_jobs never (jobs kept as succeeded), --log-level warning (no "
                "line per job)")


def _peer_env(dsn: str) -> dict[str, str]:
    return {**os.environ, "BENCH_PG_DSN": dsn,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def procrastinate_schema(watch: PgWatch) -> None:
    """Procrastinate's schema, applied by its own command (once per database)."""
    if watch.scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'procrastinate_jobs'"):
        return
    done = subprocess.run(
        [sys.executable, "-m", "procrastinate", f"--app={PROCRASTINATE_APP}", "schema",
         "--apply"], env=_peer_env(watch.pg.dsn), cwd=REPO, capture_output=True, text=True,
        timeout=120, check=False)
    if done.returncode != 0:
        raise BenchError(f"procrastinate schema --apply failed:\n{done.stdout}{done.stderr}")


def procrastinate_defer(dsn: str, n: int, batch: int, task: str) -> Filled:
    """``n`` jobs deferred with Procrastinate's ``batch_defer_async``, ``batch`` per call,
    in a process of its own (``python -m bench.procrastinate_defer``)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.procrastinate_defer", str(n), str(batch), task],
        env=_peer_env(dsn), cwd=REPO, capture_output=True, text=True,
        timeout=_timeout(n, 200), check=False)
    if done.returncode != 0:
        raise BenchError(f"deferring Procrastinate jobs failed:\n{done.stderr[-2000:]}")
    return Filled(n, float(done.stdout.strip().splitlines()[-1]), batch)


PROCRASTINATE_TABLES = ("procrastinate_jobs", "procrastinate_events")


def procrastinate_drain(services: Services, watch: PgWatch, folder: Path, n: int,
                        batch: int, settings: PeerSettings) -> tuple[Row, Filled]:
    """Defer ``n`` no-op jobs, then drain them with ``settings.workers`` worker processes
    until all have succeeded."""
    procrastinate_schema(watch)
    watch.conn.execute("TRUNCATE procrastinate_jobs CASCADE")
    filled = procrastinate_defer(watch.pg.dsn, n, batch, settings.task)
    watch.vacuum(*PROCRASTINATE_TABLES)
    log = folder / "procrastinate.log"
    procs: list[subprocess.Popen[bytes]] = []
    with open(log, "ab") as out:
        for number in range(settings.workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "procrastinate", f"--app={PROCRASTINATE_APP}",
                 "--log-level", "warning", "worker", "--queues", "bench",
                 "--name", f"bench-{number}",
                 "--concurrency", str(settings.concurrency), "--delete-jobs", "never"],
                env=_peer_env(watch.pg.dsn), cwd=REPO, stdout=out, stderr=out,
                start_new_session=True))
    groups: dict[str, Finder] = {"workers": _procs(procs)}
    groups.update(_services_groups(services, watch))
    finished = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def alive() -> None:
        for proc in procs:
            if proc.poll() is not None:
                raise BenchError(f"a Procrastinate worker exited with {proc.returncode}; "
                                 f"see {log}")

    try:
        drain = watch_drain(lambda: watch.scalar(finished), n, Meter(groups),
                            _timeout(n, 50), POLL_S, check=alive)
    finally:
        _stop(procs)
    failed = watch.scalar("SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'")
    if failed:
        raise BenchError(f"{failed} Procrastinate jobs failed: see {log}")
    row = Row(f"Procrastinate ({settings.workers} workers, --concurrency "
              f"{settings.concurrency})", drain.items, drain.seconds,
              drain.cpu_s.get("workers", 0.0), drain.cpu_s.get("postgres"),
              {"workers": drain.peak_rss.get("workers", 0)}, settings.describe(),
              _detail(drain, ("workers", "postgres", "redis", "kafka")))
    return row, filled


def _procs(procs: list[subprocess.Popen[bytes]]) -> Callable[[], list[psutil.Process]]:
    def find() -> list[psutil.Process]:
        found = []
        for proc in procs:
            found += tree(proc.pid)()
        return found
    return find


def _stop(procs: list[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

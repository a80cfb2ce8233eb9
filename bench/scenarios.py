"""Every measured scenario of a benchmark run; each returns plain values for the report.

All Kafka contenders read the same preloaded topic, each in its own consumer group; the
peers get the first records of that topic through a feeder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench import peers
from bench.asynctier_run import COMPONENTS, REPO, AsynctierRun
from bench.kafka_peers import COMMIT_INTERVAL_S
from bench.measure import BenchError, Drain, Finder, Meter, single, watch_drain
from bench.records import (
    GroupProgress,
    create_topic,
    open_loop,
    preload,
    read_values,
    warm_producer,
)
from bench.stack import Services
from bench.work import KINDS


@dataclass(frozen=True)
class Row:
    """One contender's throughput, as a row of the results table."""

    name: str
    items: int
    seconds: float
    cpu_s: float
    broker_cpu_s: float | None
    peak_rss: dict[str, int]
    note: str = ""
    detail: dict[str, float] = field(default_factory=dict)
    cores_busy: float | None = None  # the machine's, in the window (None: not measured)

    @property
    def rate(self) -> float:
        """Items per second."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_1k(self) -> float:
        """CPU seconds of the contender's processes per 1,000 items."""
        return 1000.0 * self.cpu_s / self.items if self.items else 0.0

    @property
    def broker_cpu_per_1k(self) -> float | None:
        """CPU seconds of Kafka + Redis per 1,000 items (None when their pids are unknown)."""
        if self.broker_cpu_s is None or not self.items:
            return None
        return 1000.0 * self.broker_cpu_s / self.items


@dataclass(frozen=True)
class Latency:
    """Record-to-start latency of an open-loop run."""

    rate: float
    seconds: float
    produced: int
    samples: list[float]
    file: Path | None = None
    producer_late: list[float] = field(default_factory=list)  # record timestamp - t0, ms

    def percentile(self, p: float, of: list[float] | None = None) -> float:
        """The ``p``-th percentile in ms (nearest rank) of the samples, or of ``of``."""
        values = self.samples if of is None else of
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def _read_latency(rate: float, seconds: float, produced: int, path: Path) -> Latency:
    """The samples written as ``<t0> <ms> <producer late ms>`` lines."""
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    rows = [r for r in rows if len(r) == 3]
    return Latency(rate, seconds, produced, [float(r[1]) for r in rows], path,
                   [float(r[2]) for r in rows])


def _broker_groups(services: Services) -> dict[str, Finder]:
    groups: dict[str, Finder] = {}
    if services.kafka_pid is not None:
        groups["kafka"] = single(services.kafka_pid)
    if services.redis_pid is not None:
        groups["redis"] = single(services.redis_pid)
    return groups


def _broker_cpu(services: Services, drain: Drain) -> float | None:
    keys = _broker_groups(services)
    return sum(drain.cpu_s.get(k, 0.0) for k in keys) if keys else None


def _timeout(items: int, per_s: float) -> float:
    return 60.0 + items / per_s


# --------------------------------------------------------------------------- the references


def kafka_loop(services: Services, topic: str, n: int, mode: str) -> Row:
    """The raw loop (``raw``), its retry flood (``raw_flood``) or the client-only loop
    (``client``) in its own process."""
    group = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    done = subprocess.run(
        [sys.executable, "-m", "bench.kafka_loops", mode, services.kafka_bootstrap, topic,
         group, str(n)], capture_output=True, text=True, cwd=REPO, check=False,
        timeout=_timeout(n, 1000))
    if done.returncode != 0:
        raise BenchError(f"the {mode} loop failed:\n{done.stderr[-2000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if int(got["items"]) < n:
        raise BenchError(f"the {mode} loop read {int(got['items'])} of {n} records")
    names = {"raw": "raw confluent-kafka loop (the limit)",
             "client": "confluent-kafka client only (consume, nothing else)",
             "raw_flood": "raw loop, 100% failures (each written to a retry topic)"}
    return Row(names[mode], int(got["items"]), got["seconds"], got["cpu_s"], None,
               {"process": int(got["peak_rss"])})


# --------------------------------------------------------------------------- asynctier


@contextmanager
def platform(services: Services, folder: Path, label: str,
             extra_env: dict[str, str] | None = None,
             checkout: Path = REPO) -> Iterator[AsynctierRun]:
    """An isolated asynctier run (of ``checkout``), stopped at the end whatever happens."""
    run = AsynctierRun(services, folder, label, extra_env, checkout)
    try:
        yield run
    finally:
        code = run.stop()
        if code not in (None, 0):
            print(f"  note: asynctier run ({label}) exited with {code}; see {run.log}")


def _meter(services: Services, run: AsynctierRun) -> Meter:
    groups: dict[str, Finder] = {c: run.component(c) for c in COMPONENTS}
    groups["run"] = run.parent()
    groups.update(_broker_groups(services))
    return Meter(groups)


def drain_asynctier(services: Services, run: AsynctierRun, topic: str, n: int,
                    binding: str, on_poll: Callable[[], None] | None = None) -> Drain:
    """Start ``run`` and measure until ``binding``'s group has committed ``n`` records."""
    progress = GroupProgress(services.kafka_bootstrap, run.group(binding), topic)
    meter = _meter(services, run)
    run.start()

    def committed() -> int:
        if on_poll is not None:
            on_poll()
        return progress.committed()

    try:
        return watch_drain(committed, n, meter, _timeout(n, 1000), check=run.check())
    finally:
        progress.close()


def _row(name: str, services: Services, drain: Drain, note: str = "") -> Row:
    own = ("run", *COMPONENTS)
    cpu = sum(drain.cpu_s.get(k, 0.0) for k in own)
    # per process: a bare run has a tailers process per tier and two schedulers, and
    # each is a container of its own when deployed
    rss = {k: drain.peak_rss_each.get(k, 0) for k in ("tailers", "scheduler")}
    detail = {f"cpu_s.{k}": drain.cpu_s.get(k, 0.0) for k in own}
    return Row(name, drain.items, drain.seconds, cpu, _broker_cpu(services, drain), rss,
               note, detail, drain.cores_busy)


IDEMPOTENT_NOTE = "bound --idempotent: no run-once guard"


def _idempotent(idempotent: bool) -> tuple[str, ...]:
    """The ``asynctier bind`` arguments of a binding bound as is or ``--idempotent``."""
    return ("--idempotent",) if idempotent else ()


def asynctier_noop(services: Services, folder: Path, topic: str, n: int,
                   idempotent: bool = False) -> Row:
    """The default ``asynctier run`` on the no-op function, drained until lag 0; bound as
    is (the run-once guard on), or ``--idempotent``."""
    with platform(services, folder, "noop") as run:
        run.bind("noop", topic, "noop", *_idempotent(idempotent))
        drain = drain_asynctier(services, run, topic, n, "noop")
    if idempotent:
        return _row("asynctier, no-op bound --idempotent", services, drain, IDEMPOTENT_NOTE)
    return _row("asynctier (default `asynctier run`, no-op)", services, drain)


def asynctier_limited(services: Services, folder: Path, topic: str, n: int,
                      rate: float) -> tuple[Row, bool]:
    """The same with a rate limit far above the throughput; and whether Redis saw it."""
    with platform(services, folder, "limiter") as run:
        run.bind("noop", topic, "noop", "--rate", f"{rate:g}")
        client = redis.Redis.from_url(services.redis_url)
        key = f"{run.prefix}:rate:noop"
        seen: list[bool] = []

        def look() -> None:
            if not seen and client.exists(key):
                seen.append(True)

        try:
            drain = drain_asynctier(services, run, topic, n, "noop", look)
        finally:
            client.close()
    note = ("the Redis bucket was used" if seen else
            "the Redis bucket key never appeared: the scheduler did not consult the limiter")
    return _row(f"asynctier, rate limit {rate:,.0f}/s (never binding)", services, drain,
                note), bool(seen)


def asynctier_flood(services: Services, folder: Path, topic: str, n: int,
                    idempotent: bool = False) -> Row:
    """Every call fails: the main topic's drain while everything goes to the delay topic."""
    with platform(services, folder, "flood") as run:
        run.bind("fail", topic, "fail", *_idempotent(idempotent))
        drain = drain_asynctier(services, run, topic, n, "fail")
        delay_topic = f"{run.prefix}.delay.30s"
        progress = GroupProgress(services.kafka_bootstrap, "bench-peek", delay_topic)
        handed = progress.end()
        progress.close()
    name = "asynctier, 100% failures (retry flood)"
    note = f"{handed:,} records handed off to {delay_topic}"
    if idempotent:
        name, note = name + ", bound --idempotent", f"{note}; {IDEMPOTENT_NOTE}"
    return _row(name, services, drain, note)


def asynctier_memory(services: Services, folder: Path, n: int) -> Row:
    """Peak RSS of the tailer and scheduler processes draining a backlog of ``n``."""
    topic = f"bench-mem-{n}-{uuid.uuid4().hex[:6]}"
    preload(services.kafka_bootstrap, topic, n)
    with platform(services, folder, f"mem{n}") as run:
        run.bind("noop", topic, "noop")
        drain = drain_asynctier(services, run, topic, n, "noop")
    return _row(f"asynctier, backlog {n:,}", services, drain)


def latency(services: Services, folder: Path, rate: float, seconds: float,
            idempotent: bool = False) -> Latency:
    """Open-loop producer at ``rate``; record-to-start measured inside the function; the
    binding as is (the run-once guard on), or ``--idempotent``."""
    topic = f"bench-latency-{uuid.uuid4().hex[:6]}"
    create_topic(services.kafka_bootstrap, topic)
    samples_file = folder / f"latency-{uuid.uuid4().hex[:6]}.txt"
    with platform(services, folder, "latency",
                  {"BENCH_LATENCY_FILE": str(samples_file)}) as run:
        run.bind("timed", topic, "timed", *_idempotent(idempotent))
        warm = 500
        producer = warm_producer(services.kafka_bootstrap, topic, warm)
        drain_asynctier(services, run, topic, warm, "timed")
        produced = open_loop(producer, topic, rate, seconds)
        progress = GroupProgress(services.kafka_bootstrap, run.group("timed"), topic)
        watch_drain(progress.committed, warm + produced, Meter({}), 120.0, check=run.check())
        progress.close()
    time.sleep(0.2)
    return _read_latency(rate, seconds, produced, samples_file)


def raw_latency(services: Services, folder: Path, rate: float, seconds: float) -> Latency:
    """The reference for :func:`latency`: the same open-loop producer, read by the raw
    loop (record-to-receive, in a process of its own)."""
    topic = f"bench-rawlat-{uuid.uuid4().hex[:6]}"
    create_topic(services.kafka_bootstrap, topic)
    samples_file = folder / f"rawlat-{uuid.uuid4().hex[:6]}.txt"
    total = int(rate * seconds)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.kafka_loops", "latency", services.kafka_bootstrap,
         topic, f"bench-rawlat-{uuid.uuid4().hex[:6]}", str(total), str(samples_file)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        producer = warm_producer(services.kafka_bootstrap, topic, 500)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise BenchError("the raw latency loop never read a warm-up record")
        produced = open_loop(producer, topic, rate, seconds)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return _read_latency(rate, seconds, produced, samples_file)


# --------------------------------------------------------------------------- peers


def peer_values(services: Services, topic: str, n: int) -> list[bytes]:
    """The first ``n`` records of ``topic``, for the peers' feeders."""
    return read_values(services.kafka_bootstrap, topic, n)


def celery(services: Services, folder: Path, values: list[bytes]) -> Row:
    """Celery's workers draining one task per record."""
    got = peers.run_celery(services, values, folder, _timeout(len(values), 100))
    return _peer_row("Celery (Redis, acks_late, ignore_result, prefork -c 2)", services, got)


def dramatiq(services: Services, folder: Path, values: list[bytes]) -> Row:
    """Dramatiq's workers draining one message per record."""
    got = peers.run_dramatiq(services, values, folder, _timeout(len(values), 100))
    return _peer_row("Dramatiq (Redis, -p 2 -t 8)", services, got)


def _peer_row(name: str, services: Services, got: peers.PeerRun) -> Row:
    drain = got.drain
    return Row(name, drain.items, drain.seconds, drain.cpu_s.get("workers", 0.0),
               _broker_cpu(services, drain), {"workers": drain.peak_rss.get("workers", 0)},
               f"enqueued beforehand in {got.enqueue_s:.1f} s (not measured)")


# --------------------------------------------------------------------------- Kafka-native peers

#: asynctier's function for each kind of work of :mod:`bench.work`.
ASYNCTIER_WORK = {"noop": "noop", "sleep": "sleep1ms", "asleep": "asleep1ms"}
PEER_NAMES = {"quix": "Quix Streams", "faust": "faust-streaming",
              "pc": "Confluent Parallel Consumer (JVM)"}


def asynctier_work(services: Services, folder: Path, topic: str, n: int, work: str,
                   checkout: Path = REPO) -> Row:
    """The default ``asynctier run`` (of ``checkout``) draining ``topic`` with one kind of
    work (the binding as a user binds it: run-once guard on, default concurrency)."""
    function = ASYNCTIER_WORK[work]
    with platform(services, folder, function, checkout=checkout) as run:
        run.bind(function, topic, function)
        drain = drain_asynctier(services, run, topic, n, function)
    return _row(f"asynctier, {KINDS[work]}", services, drain)


def kafka_peer(services: Services, folder: Path, kind: str, topic: str, n: int,
               work: str) -> Row:
    """Quix Streams or faust-streaming draining ``topic`` with one kind of work."""
    drain = peers.run_kafka_peer(services, kind, topic, n, work, folder,
                                 _timeout(n, 100 if work == "noop" else 20))
    note = (f"{peers.KAFKA_PEER_WORKERS} worker processes, one group; commits every "
            f"{COMMIT_INTERVAL_S:g} s; measured once the group was stable")
    if kind == "pc":
        note += "; unordered, 64 records at once per process"
    return Row(f"{PEER_NAMES[kind]}, {KINDS[work]}", drain.items, drain.seconds,
               drain.cpu_s.get("workers", 0.0), _broker_cpu(services, drain),
               {"workers": drain.peak_rss.get("workers", 0)}, note)

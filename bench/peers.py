"""The peers on the same records: Celery and Dramatiq, each with 2 worker processes.

A feeder first reads the records from the topic and enqueues one task per record (that
time is not measured); then the workers start and :func:`~bench.measure.watch_drain`
measures how fast they empty the queue: progress is ``N - (tasks queued or unacked)``,
read from the broker's own Redis keys, so a task counts once its worker acknowledged it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.measure import BenchError, Drain, Meter, single, tree, watch_drain
from bench.stack import Services

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class PeerRun:
    """One peer's measured drain and how long its feeder took to enqueue."""

    drain: Drain
    enqueue_s: float


def _env(services: Services, queue: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"BENCH_REDIS_URL": services.redis_url, "BENCH_QUEUE": queue,
                "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", "")})
    return env


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=REPO,
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _alive(proc: subprocess.Popen[bytes], log: Path) -> Callable[[], None]:
    def check() -> None:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise BenchError(f"worker exited with {proc.returncode}:\n{tail}")
    return check


def _drain(services: Services, argv: list[str], env: dict[str, str], log: Path,
           remaining: Callable[[], int], n: int, timeout_s: float) -> Drain:
    proc = _start(argv, env, log)
    try:
        meter = Meter({"workers": tree(proc.pid), "redis": single(services.redis_pid)})
        return watch_drain(lambda: n - remaining(), n, meter, timeout_s,
                           check=_alive(proc, log))
    finally:
        _stop(proc)


def run_celery(services: Services, values: list[bytes], folder: Path,
               timeout_s: float) -> PeerRun:
    """Celery, Redis broker, acks_late, ignore_result, prefork ``-c 2``."""
    from bench.celery_app import make_app

    queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
    app = make_app(services.redis_url, queue)
    started = time.monotonic()
    for value in values:
        app.send_task("bench.noop", args=[value.decode()], queue=queue)
    enqueue_s = time.monotonic() - started
    client = redis.Redis.from_url(services.redis_url)
    argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker", "-P",
            "prefork", "-c", "2", "-Q", queue, "-l", "WARNING", "--without-gossip",
            "--without-mingle", "--without-heartbeat"]

    def remaining() -> int:
        return int(client.llen(queue)) + int(client.hlen("unacked"))

    try:
        drain = _drain(services, argv, _env(services, queue), folder / "celery.log",
                       remaining, len(values), timeout_s)
    finally:
        client.delete(queue)
        client.close()
    return PeerRun(drain, enqueue_s)


def run_dramatiq(services: Services, values: list[bytes], folder: Path,
                 timeout_s: float) -> PeerRun:
    """Dramatiq, Redis broker, ``-p 2`` (8 threads each, the default)."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    queue = f"bench-dramatiq-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=services.redis_url)  # type: ignore[no-untyped-call]
    broker.declare_queue(queue)
    started = time.monotonic()
    for value in values:
        broker.enqueue(dramatiq.Message(queue_name=queue, actor_name="bench_noop",
                                        args=(value.decode(),), kwargs={}, options={}))
    enqueue_s = time.monotonic() - started
    broker.close()
    client = redis.Redis.from_url(services.redis_url)
    argv = [sys.executable, "-m", "dramatiq", "bench.dramatiq_app", "-p", "2", "-t", "8",
            "-Q", queue]

    def remaining() -> int:
        return int(client.hlen(f"dramatiq:{queue}.msgs"))

    try:
        drain = _drain(services, argv, _env(services, queue), folder / "dramatiq.log",
                       remaining, len(values), timeout_s)
    finally:
        client.delete(f"dramatiq:{queue}", f"dramatiq:{queue}.msgs")
        client.close()
    return PeerRun(drain, enqueue_s)


#: The Kafka-native peers' worker processes, one consumer group (issue 30).
KAFKA_PEER_WORKERS = 2
#: The interpreter of the Kafka-native peers: a venv of their own (quixstreams pins an
#: older confluent-kafka than asynctier runs on); ``BENCH_PEERS_PYTHON`` overrides it.
PEERS_VENV = REPO / ".venv-peers"


#: Confluent Parallel Consumer's contender: a Maven project built on first use.
PC_DIR = REPO / "bench" / "parallel_consumer"
PC_MAIN = "asynctier.bench.PcBench"


def parallel_consumer_classpath() -> str:
    """The classpath of :data:`PC_MAIN` (``bench/parallel_consumer``), built with Maven
    (from Maven Central) when its jar is missing."""
    jar, lib = PC_DIR / "target" / "pc-bench-1.jar", PC_DIR / "target" / "lib"
    if not jar.exists() or not lib.is_dir():
        print("   building bench/parallel_consumer with Maven (first use)", flush=True)
        done = subprocess.run(["mvn", "-q", "package", "dependency:copy-dependencies",
                               f"-DoutputDirectory={lib}"], cwd=PC_DIR, capture_output=True,
                              text=True, timeout=900, check=False)
        if done.returncode != 0 or not jar.exists():
            raise BenchError("could not build bench/parallel_consumer (Java 17 and Maven "
                             f"reaching Maven Central are needed):\n{done.stdout[-3000:]}"
                             f"{done.stderr[-2000:]}")
    return os.pathsep.join([str(jar), str(lib / "*")])


def peers_python() -> str:
    """The Python that runs the Quix Streams and faust-streaming workers."""
    python = os.environ.get("BENCH_PEERS_PYTHON") or str(PEERS_VENV / "bin" / "python")
    if not Path(python).exists():
        raise BenchError(
            f"no interpreter for the Kafka-native peers at {python}: run `make bench` (or "
            "`ASYNCTIER_VENV=.venv-peers ASYNCTIER_EXTRAS=kafka-peers scripts/setup.sh`), "
            "or set BENCH_PEERS_PYTHON to a Python with quixstreams and faust-streaming")
    return python


def _all_ready(procs: list[subprocess.Popen[bytes]], states: Path, log: Path,
               timeout_s: float = 120.0) -> None:
    """Wait until every worker wrote its ready file, then let them all go at once."""
    deadline = time.monotonic() + timeout_s
    checks = [_alive(proc, log) for proc in procs]
    while len(list(states.glob("*.ready"))) < len(procs):
        for alive in checks:
            alive()
        if time.monotonic() > deadline:
            raise BenchError(f"the peer workers were not ready after {timeout_s:g} s; "
                             f"see {log}")
        time.sleep(0.02)
    (states / "go").touch()


def group_settled(bootstrap: str, group: str, members: int) -> Callable[[], bool]:
    """A check that turns true (and stays true) once ``group`` is stable with ``members``
    members, each with partitions: the peers' two workers join one after the other, and
    the first one's drain until the second joins is a rebalance, not their pace."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    seen: list[bool] = []

    def settled() -> bool:
        if not seen:
            try:
                got = admin.describe_consumer_groups([group])[group].result(timeout=5)
            except Exception:  # not there yet: the group is created by its first join
                return False
            if (got.state == ConsumerGroupState.STABLE and len(got.members) == members
                    and all(m.assignment.topic_partitions for m in got.members)):
                seen.append(True)
        return bool(seen)
    return settled


def run_kafka_peer(services: Services, kind: str, topic: str, n: int, work: str,
                   folder: Path, timeout_s: float) -> Drain:
    """Quix Streams or faust-streaming (``kind``) draining ``topic`` (``n`` records) with
    :data:`KAFKA_PEER_WORKERS` worker processes in one fresh consumer group. The window
    opens at the first commit seen once the group is stable with every worker in it, and
    ends when the group's committed offsets reach ``n``."""
    from bench.records import GroupProgress

    group = f"bench-{kind}-{work}-{uuid.uuid4().hex[:6]}"
    log = folder / f"{kind}-{work}.log"
    env = _env(services, group)
    python = peers_python() if kind != "pc" else ""
    states = folder / group
    states.mkdir()
    head = ([python, "-m", "bench.kafka_peers", kind] if kind != "pc" else
            ["java", "-Xmx512m", "-cp", parallel_consumer_classpath(), PC_MAIN])
    procs = [_start([*head, services.kafka_bootstrap, topic, group, work,
                     str(states / str(i))], env, log)
             for i in range(KAFKA_PEER_WORKERS)]
    _all_ready(procs, states, log)
    progress = GroupProgress(services.kafka_bootstrap, group, topic)
    settled = group_settled(services.kafka_bootstrap, group, KAFKA_PEER_WORKERS)
    checks = [_alive(proc, log) for proc in procs]

    def find() -> list[Any]:
        return [p for proc in procs for p in tree(proc.pid)()]

    def done() -> int:
        return progress.committed() if settled() else 0

    def check() -> None:
        for alive in checks:
            alive()

    try:
        meter = Meter({"workers": find, "kafka": single(services.kafka_pid)})
        drain = watch_drain(done, n, meter, timeout_s, check=check)
    finally:
        progress.close()
        for proc in procs:
            _stop(proc)
    if not drain.items:
        raise BenchError(f"{kind} had drained all {n:,} records of {topic} when the window "
                         "opened: nothing was measured (give it a larger topic)")
    return drain

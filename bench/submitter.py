"""One Submitter's accept rate with batched calls, and the latency it adds per call.

    python -m bench.submitter [--workloads 100000] [--batch 500] [--callers 4]

Starts PostgreSQL, Kafka and Redis on free ports, binds a queue binding, runs one
``asynctier run submitter`` process and sends ``--workloads`` small JSON workloads (with
ids) in calls of ``--batch`` from ``--callers`` threads of this process. Prints the
accepted workloads per second, and per call the p50/p99 of the Submitter round trip next
to the same batch written straight to the store (``QueueStore.enqueue``: what a direct
writer pays); the difference is what the Submitter adds. Nothing drains the queue during
the run (the backlog cap is raised past the run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from asynctier.client import Client
from asynctier.dev.process import free_port
from asynctier.dev.testing import start_test_kafka, start_test_postgres, start_test_redis
from asynctier.queue import NewItem, QueueStore
from asynctier.submitter.protocol import Workload


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (milliseconds in, milliseconds out)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def submit_all(client: Client, n: int, batch: int, callers: int) -> tuple[float, list[float]]:
    """Seconds to get ``n`` workloads accepted, and each call's milliseconds."""
    calls: list[float] = []
    per = n // callers

    def caller(c: int) -> None:
        for at in range(c * per, (c + 1) * per, batch):
            loads = [Workload(b'{"n": %d, "pad": "0123456789abcdef"}' % i, id=f"b{i}",
                              priority=i % 3) for i in range(at, min(at + batch, (c + 1) * per))]
            t = time.perf_counter()
            results = client.submit_many("bench", loads)
            calls.append((time.perf_counter() - t) * 1000)
            assert all(r.status == "accepted" for r in results), results[0]

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, calls


def direct(dsn: str, ns: str, n: int, batch: int) -> list[float]:
    """Each call's milliseconds writing the same batches straight to the store."""
    calls = []
    with QueueStore(dsn) as store:
        for at in range(0, n, batch):
            items = [NewItem("direct", b'{"n": %d, "pad": "0123456789abcdef"}' % i,
                             id=f"d{i}", priority=i % 3) for i in range(at, at + batch)]
            t = time.perf_counter()
            store.enqueue(ns, items)
            calls.append((time.perf_counter() - t) * 1000)
    return calls


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--callers", type=int, default=4)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="asynctier-bench-submitter-"))
    pg, kafka, redis = (start_test_postgres(root), start_test_kafka(root),
                        start_test_redis(root))
    ns = f"bench{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = {**os.environ, "ASYNCTIER_KAFKA_BOOTSTRAP": kafka.bootstrap,
           "ASYNCTIER_REDIS_URL": redis.url, "ASYNCTIER_QUEUE_SHARDS": pg.dsn,
           "ASYNCTIER_PREFIX": ns, "ASYNCTIER_SUBMITTER_LISTEN": f"127.0.0.1:{port}"}
    proc = None
    try:
        subprocess.run([sys.executable, "-m", "asynctier", "bind", "bench", "--queue",
                        "work", "--tenant", ns, "--function", "bench.noop:noop"],
                       env=env, check=True, capture_output=True)
        proc = subprocess.Popen([sys.executable, "-m", "asynctier", "run", "submitter"],
                                env=env)
        load_before = os.getloadavg()
        with Client([f"127.0.0.1:{port}"], deadline_s=60.0) as client:
            deadline = time.monotonic() + 60
            while True:  # the Submitter is up once a call is answered
                try:
                    client.submit_many("bench", [Workload(b"{}", id="warm")])
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            seconds, calls = submit_all(client, args.workloads, args.batch, args.callers)
        straight = direct(pg.dsn, ns, min(args.workloads, 20_000), args.batch)
        load_after = os.getloadavg()
        rate = args.workloads / seconds
        print(f"workloads: {args.workloads:,} in calls of {args.batch}, {args.callers} "
              f"callers, one Submitter: {seconds:.1f} s, {rate:,.0f} accepted/s")
        print(f"Submitter call ms: p50 {pct(calls, 0.5):.1f}, p99 {pct(calls, 0.99):.1f} "
              f"(n={len(calls)})")
        print(f"direct enqueue ms (one writer): p50 {pct(straight, 0.5):.1f}, p99 "
              f"{pct(straight, 0.99):.1f}, median {statistics.median(straight):.1f}")
        print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
              f"({os.cpu_count()} cores)")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        for node in (kafka, redis, pg):
            node.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""One Submitter's accept rate with batched calls, beside the raw enqueue loop.

    python -m bench.submitter [--workloads 60000] [--batch 500] [--callers 4] [--rounds 3]

Starts PostgreSQL, Kafka and Redis on free ports, binds a queue binding, runs one
``asynctier run submitter`` process and, in each round, sends ``--workloads`` small JSON
workloads (with ids) in calls of ``--batch`` from ``--callers`` threads of this process;
beside it (same round, the order alternating) the raw enqueue loop writes as many items
straight to the store (``QueueStore.enqueue`` from one writer in batches of
``--raw-batch``, as ``bench/queue_drain.py`` fills its queue). Prints per round the
accepted workloads per second, the raw loop's items per second, each side's per-call
p50/p99, and the CPU seconds per 1,000 workloads of the Submitter, of PostgreSQL and of
this process (the callers); then the medians and a final line. Nothing drains the queue
(the backlog cap is raised past the run).
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asynctier.client import Client
from asynctier.dev.process import free_port
from asynctier.dev.testing import start_test_kafka, start_test_postgres, start_test_redis
from asynctier.queue import NewItem, QueueStore
from asynctier.submitter.protocol import Workload
from bench.measure import Meter, single, tree

PAYLOAD = b'{"n": %d, "pad": "0123456789abcdef"}'


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (milliseconds in, milliseconds out)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Side:
    """One measured side of a round: ``n`` workloads in ``seconds``, each call's ms, and
    the CPU seconds of each group of processes in that window."""

    n: int
    seconds: float
    calls: list[float]
    cpu_s: dict[str, float]

    @property
    def rate(self) -> float:
        """Workloads per second."""
        return self.n / self.seconds

    def describe(self) -> str:
        """Its figures on one line."""
        cpu = ", ".join(f"{k} {v * 1000 / self.n:.3f}" for k, v in self.cpu_s.items())
        return (f"{self.rate:,.0f}/s, call p50 {pct(self.calls, 0.5):.1f} ms, p99 "
                f"{pct(self.calls, 0.99):.1f} ms (n={len(self.calls)}); CPU-s/1k: {cpu}")


def measured(meter: Meter, n: int, run: Callable[[], list[float]]) -> Side:
    """Run ``run`` (which returns each call's ms) and measure its window."""
    meter.sample()
    before = meter.cpu()
    started = time.perf_counter()
    calls = run()
    seconds = time.perf_counter() - started
    meter.sample()
    after = meter.cpu()
    return Side(n, seconds, calls, {k: after[k] - before[k] for k in after})


def submit_all(client: Client, tag: str, n: int, batch: int, callers: int) -> list[float]:
    """Get ``n`` workloads accepted from ``callers`` threads; each call's milliseconds."""
    calls: list[float] = []
    per = n // callers

    def caller(c: int) -> None:
        for at in range(c * per, (c + 1) * per, batch):
            loads = [Workload(PAYLOAD % i, id=f"{tag}{i}", priority=i % 3)
                     for i in range(at, min(at + batch, (c + 1) * per))]
            t = time.perf_counter()
            results = client.submit_many("bench", loads)
            calls.append((time.perf_counter() - t) * 1000)
            assert all(r.status == "accepted" for r in results), results[0]

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return calls


def raw_loop(store: QueueStore, ns: str, tag: str, n: int, batch: int) -> list[float]:
    """The raw enqueue loop: ``n`` items straight to the store; each call's ms."""
    calls = []
    for at in range(0, n, batch):
        items = [NewItem("raw", PAYLOAD % i, id=f"{tag}{i}", priority=i % 3)
                 for i in range(at, min(at + batch, n))]
        t = time.perf_counter()
        store.enqueue(ns, items)
        calls.append((time.perf_counter() - t) * 1000)
    return calls


def parse() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workloads", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--raw-batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def wait_up(client: Client) -> None:
    """Until the Submitter answers a call (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            client.submit_many("bench", [Workload(b"{}", id="warm")])
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> None:
    """Run the benchmark and print its figures."""
    args = parse()
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
        pg_pid = pg.daemon.pid()
        assert pg_pid is not None
        meter = Meter({"submitter": single(proc.pid), "postgres": tree(pg_pid),
                       "callers": single(os.getpid())})
        accepted: list[Side] = []
        raw: list[Side] = []
        print(f"{args.workloads:,} workloads a side, calls of {args.batch} from "
              f"{args.callers} callers; raw loop: one writer, batches of {args.raw_batch}; "
              f"{os.cpu_count()} cores", flush=True)
        with Client([f"127.0.0.1:{port}"], deadline_s=60.0) as client, \
                QueueStore(pg.dsn) as store:
            wait_up(client)
            store.migrate()
            for r in range(args.rounds):
                def submitter(tag: str = f"s{r}-") -> None:
                    accepted.append(measured(meter, args.workloads, lambda: submit_all(
                        client, tag, args.workloads, args.batch, args.callers)))

                def straight(tag: str = f"r{r}-") -> None:
                    raw.append(measured(meter, args.workloads, lambda: raw_loop(
                        store, ns, tag, args.workloads, args.raw_batch)))

                for side in (submitter, straight) if r % 2 == 0 else (straight, submitter):
                    side()
                print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}):\n"
                      f"  Submitter  {accepted[-1].describe()}\n"
                      f"  raw loop   {raw[-1].describe()}", flush=True)
        report(accepted, raw)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        for node in (kafka, redis, pg):
            node.stop()
        shutil.rmtree(root, ignore_errors=True)


def report(accepted: list[Side], raw: list[Side]) -> None:
    """The medians over the rounds, and the final line."""
    def med(sides: list[Side], f: Callable[[Side], float]) -> float:
        return statistics.median(f(s) for s in sides)

    ratio = statistics.median(a.rate / r.rate for a, r in zip(accepted, raw, strict=True))
    print(f"median Submitter {med(accepted, lambda s: s.rate):,.0f} accepted/s, call p50 "
          f"{med(accepted, lambda s: pct(s.calls, 0.5)):.1f} / p99 "
          f"{med(accepted, lambda s: pct(s.calls, 0.99)):.1f} ms")
    print(f"median raw loop  {med(raw, lambda s: s.rate):,.0f} items/s, call p50 "
          f"{med(raw, lambda s: pct(s.calls, 0.5)):.1f} / p99 "
          f"{med(raw, lambda s: pct(s.calls, 0.99)):.1f} ms")
    print(f"accept_per_s={med(accepted, lambda s: s.rate):.0f} "
          f"raw_enqueue_per_s={med(raw, lambda s: s.rate):.0f} accept_vs_raw={ratio:.2f}")


if __name__ == "__main__":
    main()

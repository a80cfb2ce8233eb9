"""One Submitter's accept rate with batched calls, beside the raw enqueue loop and the
end-to-end queue drain, in one run (issue 27's goal: accept rate >= 2x the drain).

    python -m bench.submitter [--workloads 40000] [--batch 1000] [--callers 4] [--rounds 3]
                              [--drain-items 50000] [--warmup-rounds 1]

Starts PostgreSQL, Kafka and Redis on free ports (``bench/stack.py``), binds a queue
binding, runs one ``asynctier run submitter`` process and, in each round, sends
``--workloads`` small JSON workloads (with ids) in calls of ``--batch`` from ``--callers``
threads of this process; beside it in the same round (the order rotating) the raw enqueue
loop writes as many items straight to the store (``QueueStore.enqueue`` from one writer in
batches of ``--raw-batch``, as ``bench/queue_drain.py`` fills its queue), and the queue
drain of ``bench/queue_drain.py --only queue`` (``--drain-items`` items enqueued, then
drained by a default ``asynctier run``; 0: no drain) runs on the same services. Prints per
round the accepted workloads per second, the raw loop's and the drain's items per second,
each side's per-call p50/p99, the CPU seconds per 1,000 workloads of the Submitter, of
PostgreSQL and of this process (the callers), and the ratio accepted / drained; then the
medians (of the counted rounds: warm-ups are printed, not counted) and a final line.
Nothing drains the Submitter's own queue (the backlog cap is raised past the run).
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
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.client import Client
from asynctier.dev.process import free_port
from asynctier.queue import NewItem, QueueStore
from asynctier.submitter.protocol import Workload
from bench import queue_report
from bench import queue_scenarios as qs
from bench.measure import Meter, single
from bench.stack import Services, postgres, services

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
    parser.add_argument("--workloads", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--raw-batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="rounds first, printed, not counted [1]")
    parser.add_argument("--drain-items", type=int, default=50_000,
                        help="items of the queue drain in each round; 0: no drain [50000]")
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


@dataclass
class Rounds:
    """Every side's figures, round by round (warm-up rounds included, flagged)."""

    counted: list[bool] = field(default_factory=list)
    accepted: list[Side] = field(default_factory=list)
    raw: list[Side] = field(default_factory=list)
    drain: list[float] = field(default_factory=list)  # items/s, one per round (or none)
    drain_cpu: list[str] = field(default_factory=list)  # its CPU-s per 1k, as text


def main() -> None:
    """Run the benchmark and print its figures."""
    args = parse()
    folder = Path(tempfile.mkdtemp(prefix="asynctier-bench-submitter-"))
    ns = f"bench{uuid.uuid4().hex[:6]}"
    port = free_port()
    with services() as svc, postgres() as pg:
        env = {**os.environ, "ASYNCTIER_KAFKA_BOOTSTRAP": svc.kafka_bootstrap,
               "ASYNCTIER_REDIS_URL": svc.redis_url, "ASYNCTIER_QUEUE_SHARDS": pg.dsn,
               "ASYNCTIER_PREFIX": ns, "ASYNCTIER_SUBMITTER_LISTEN": f"127.0.0.1:{port}"}
        subprocess.run([sys.executable, "-m", "asynctier", "bind", "bench", "--queue",
                        "work", "--tenant", ns, "--function", "bench.noop:noop"],
                       env=env, check=True, capture_output=True)
        proc = subprocess.Popen([sys.executable, "-m", "asynctier", "run", "submitter"],
                                env=env)
        watch = qs.PgWatch(pg)
        try:
            rounds = run_rounds(args, Meter({"submitter": single(proc.pid),
                                             "postgres": watch.server(),
                                             "callers": single(os.getpid())}),
                                port, ns, svc, watch, folder)
        finally:
            watch.close()
            proc.terminate()
            proc.wait(30)
    report(rounds)
    shutil.rmtree(folder, ignore_errors=True)


def run_rounds(args: argparse.Namespace, meter: Meter, port: int, ns: str, svc: Services,
               watch: qs.PgWatch, folder: Path) -> Rounds:
    """Every round: the Submitter, the raw loop and the drain, the order rotating."""
    out = Rounds()
    print(f"{args.workloads:,} workloads a side, calls of {args.batch} from "
          f"{args.callers} callers; raw loop: one writer, batches of {args.raw_batch}; "
          f"drain: {args.drain_items:,} items; {os.cpu_count()} cores; logs in {folder}",
          flush=True)
    with Client([f"127.0.0.1:{port}"], deadline_s=60.0) as client, \
            QueueStore(watch.pg.dsn) as store:
        wait_up(client)
        store.migrate()
        for r in range(args.warmup_rounds + args.rounds):
            def submitter(tag: str = f"s{r}-") -> None:
                out.accepted.append(measured(meter, args.workloads, lambda: submit_all(
                    client, tag, args.workloads, args.batch, args.callers)))

            def straight(tag: str = f"r{r}-") -> None:
                out.raw.append(measured(meter, args.workloads, lambda: raw_loop(
                    store, ns, tag, args.workloads, args.raw_batch)))

            def drain() -> None:
                row, _ = qs.queue_drain(svc, watch, folder, args.drain_items, 1000)
                out.drain.append(row.rate)
                out.drain_cpu.append(f"own {row.cpu_per_1k:.3f}"
                                     + queue_report.service_cpu_text(row))

            sides = [submitter, straight] + ([drain] if args.drain_items else [])
            at = r % len(sides)
            counted = r >= args.warmup_rounds
            out.counted.append(counted)
            load = os.getloadavg()
            for side in sides[at:] + sides[:at]:
                side()
            drained = (f"\n  queue drain {out.drain[-1]:,.0f} items/s ({out.drain_cpu[-1]});"
                       f" accepted / drained {out.accepted[-1].rate / out.drain[-1]:.2f}"
                       if args.drain_items else "")
            print(f"{'round' if counted else 'warm-up round (not counted)'} {r + 1} "
                  f"(load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}):\n"
                  f"  Submitter  {out.accepted[-1].describe()}\n"
                  f"  raw loop   {out.raw[-1].describe()}{drained}", flush=True)
    return out


def report(rounds: Rounds) -> None:
    """The medians over the counted rounds, and the final line."""
    keep = [i for i, c in enumerate(rounds.counted) if c] or list(range(len(rounds.counted)))
    accepted = [rounds.accepted[i] for i in keep]
    raw = [rounds.raw[i] for i in keep]

    def med(sides: list[Side], f: Callable[[Side], float]) -> float:
        return statistics.median(f(s) for s in sides)

    ratio = statistics.median(a.rate / r.rate for a, r in zip(accepted, raw, strict=True))
    print(f"median Submitter {med(accepted, lambda s: s.rate):,.0f} accepted/s, call p50 "
          f"{med(accepted, lambda s: pct(s.calls, 0.5)):.1f} / p99 "
          f"{med(accepted, lambda s: pct(s.calls, 0.99)):.1f} ms")
    print(f"median raw loop  {med(raw, lambda s: s.rate):,.0f} items/s, call p50 "
          f"{med(raw, lambda s: pct(s.calls, 0.5)):.1f} / p99 "
          f"{med(raw, lambda s: pct(s.calls, 0.99)):.1f} ms")
    line = (f"accept_per_s={med(accepted, lambda s: s.rate):.0f} "
            f"raw_enqueue_per_s={med(raw, lambda s: s.rate):.0f} accept_vs_raw={ratio:.2f}")
    if rounds.drain:
        drain = [rounds.drain[i] for i in keep]
        vs = statistics.median(a.rate / d for a, d in zip(accepted, drain, strict=True))
        print(f"median queue drain {statistics.median(drain):,.0f} items/s; accepted / "
              f"drained (median of the rounds' ratios) {vs:.2f}: goal >= 2, "
              f"{'met' if vs >= 2 else 'missed'}")
        line += f" drain_per_s={statistics.median(drain):.0f} accept_vs_drain={vs:.2f}"
    print(line, flush=True)


if __name__ == "__main__":
    main()

"""``python bench/queue_drain.py [--quick]``: issue 25's benchmark, the queue drain.

In one run on this machine, in interleaved rounds (every other one in reverse order):

- asynctier's PostgreSQL queue: N small JSON items enqueued in batches (the enqueue
  throughput), then drained by the default ``asynctier run`` (a binding ``--queue`` to
  ``bench.noop:noop``) from full to empty, bound as is (the run-once guard: the headline)
  and ``--idempotent``;
- Procrastinate on the same PostgreSQL: jobs deferred with its batch API, drained by two
  worker processes;
- asynctier's Kafka drain of N records (``bench/scenarios.py``'s ``asynctier_noop``, as
  is and ``--idempotent``), for the ratio;
- River (Go, ``bench/river``, built by ``queue_scenarios.build_river``) on the same PostgreSQL: N
  no-op jobs by ``InsertManyFast``, drained by its client; after the rounds, the pickup
  (enqueue-to-start of single items, idle then at ``--loaded-rate``), River's and
  asynctier's.

Writes its section of ``bench/RESULTS.md`` (between the ``queue-drain`` markers; the rest
of the file is kept; not in ``--quick`` unless ``--out`` says where) and prints the final
line::

    queue_ratio_vs_procrastinate=31.2 queue_ratio_vs_kafka=0.35 enqueue_per_s=52000 ...
    ... drain_vs_river=.. enqueue_vs_river=.. pickup_p50_ms=.. pickup_p99_ms=.. (idle)
    pickup_p99_vs_river=.. (loaded: asynctier's p99 over River's)

Kafka and Redis as in ``bench/run.py``; PostgreSQL: the first of ``ASYNCTIER_QUEUE_SHARDS``
when set, else a server started by the run on a free loopback port.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402

from bench import queue_report, scenarios  # noqa: E402
from bench import queue_scenarios as qs  # noqa: E402
from bench.queue_report import QueueResults  # noqa: E402
from bench.records import preload  # noqa: E402
from bench.stack import Postgres, Services, machine, postgres, services  # noqa: E402

KEYS = ("queue", "queue_idempotent", "kafka", "kafka_idempotent", "procrastinate", "river")


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line; ``--quick`` changes the defaults of the sizes."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, one round")
    p.add_argument("--items", type=int, help="queue items and Kafka records [100000; "
                                             "quick 10000]")
    p.add_argument("--peer-items", type=int, help="Procrastinate jobs [10000; quick 2000]")
    p.add_argument("--batch", type=int, default=1000,
                   help="items per enqueue call, and jobs per Procrastinate batch_defer "
                        "[1000]")
    p.add_argument("--rounds", type=int, help="interleaved measured rounds [3; quick 1]")
    p.add_argument("--warmup-rounds", type=int,
                   help="discarded rounds first (Kafka's JIT, PostgreSQL's caches) "
                        "[1; quick 0]")
    p.add_argument("--workers", type=int, default=2, help="Procrastinate worker processes [2]")
    p.add_argument("--concurrency", type=int, default=10,
                   help="Procrastinate's --concurrency per worker [10]")
    p.add_argument("--peer-task", choices=("noop", "noop_async"), default="noop_async",
                   help="Procrastinate's task: an async def (no thread hop: its cheapest) or a def "
                        "like asynctier's [noop_async]")
    p.add_argument("--river-workers", type=int, default=2000,
                   help="River's MaxWorkers (goroutines; GOMAXPROCS 2) [2000]")
    p.add_argument("--pickups", type=int, help="single items of the idle pickup (five "
                                               "times as many loaded) [200; quick 40]")
    p.add_argument("--loaded-rate", type=float, default=500.0,
                   help="single items a second of the loaded pickup [500]")
    p.add_argument("--only", help=f"comma-separated subset of {','.join(KEYS)}")
    p.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                   help="py-spy the queue drain's tailer and scheduler (auto: when a goal "
                        "is missed, not in --quick)")
    p.add_argument("--out", type=Path, help="results file [bench/RESULTS.md; quick: none]")
    args = p.parse_args(argv)
    quick = args.quick
    args.items = args.items or (10_000 if quick else 100_000)
    args.peer_items = args.peer_items or (2_000 if quick else 10_000)
    args.pickups = args.pickups or (40 if quick else 200)
    args.rounds = max(1, args.rounds or (1 if quick else 3))
    if args.warmup_rounds is None:
        args.warmup_rounds = 0 if quick else 1
    args.only = set(args.only.split(",")) if args.only else set(KEYS)
    if args.out is None and not quick:
        args.out = REPO / "bench" / "RESULTS.md"
    return args


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run(args: argparse.Namespace, results: QueueResults, folder: Path) -> None:
    """Every round of every selected contender."""
    peer = qs.PeerSettings(args.workers, args.concurrency, args.peer_task)
    results.settings["Procrastinate"] = peer.describe()
    if "river" in args.only:
        results.settings["River"] = qs.RIVER_NOTE.replace("--river-workers",
                                                          f"{args.river_workers:,}")
    with services() as svc, postgres() as pg:
        results.settings["services"] = (
            ("Kafka and Redis started by this run" if svc.own else
             f"Kafka {svc.kafka_bootstrap} and Redis from the environment")
            + ("; PostgreSQL started by this run" if pg.own else
               "; PostgreSQL from ASYNCTIER_QUEUE_SHARDS"))
        watch = qs.PgWatch(pg)
        results.settings["PostgreSQL"] = watch.conn.execute("SHOW server_version"
                                                            ).fetchone()[0]  # type: ignore[index]
        try:
            topic = f"bench-qk-{uuid.uuid4().hex[:6]}"
            if {"kafka", "kafka_idempotent"} & args.only:
                seconds = preload(svc.kafka_bootstrap, topic, args.items)
                print(f"preloaded {args.items:,} records into {topic} in {seconds:.1f} s",
                      flush=True)
            steps: list[tuple[str, Callable[[], None]]] = [
                ("queue", lambda: results.add("queue", *qs.queue_drain(
                    svc, watch, folder, args.items, args.batch))),
                ("queue_idempotent", lambda: results.add("queue_idempotent", *qs.queue_drain(
                    svc, watch, folder, args.items, args.batch, idempotent=True))),
                ("kafka", lambda: results.add("kafka", scenarios.asynctier_noop(
                    svc, folder, topic, args.items))),
                ("kafka_idempotent", lambda: results.add(
                    "kafka_idempotent", scenarios.asynctier_noop(
                        svc, folder, topic, args.items, True))),
                ("procrastinate", lambda: results.add("procrastinate", *qs.procrastinate_drain(
                    svc, watch, folder, args.peer_items, args.batch, peer))),
                ("river", lambda: results.add("river", *qs.river_drain(
                    program, pg.dsn, args.items, args.batch, args.river_workers)))]
            program = qs.build_river(folder) if "river" in args.only else Path()
            steps = [s for s in steps if s[0] in args.only]
            total = args.warmup_rounds + args.rounds
            for number in range(total):
                warm = number < args.warmup_rounds
                print(f"-- {'warm-up round (not counted)' if warm else 'round'} "
                      f"{number + 1 if warm else number - args.warmup_rounds + 1}; "
                      f"load {_load()}", flush=True)
                results.start_round(counted=not warm, load=_load())
                for name, fn in steps if number % 2 == 0 else reversed(steps):
                    _step(results, folder, name, fn)
            if "river" in args.only:
                _step(results, folder, "pickup", lambda: _pickups(args, results, svc, pg,
                                                                   folder, program))
            if _want_profile(args, results):
                print("== profile (py-spy on the queue drain's tailer and scheduler)",
                      flush=True)
                got: dict[str, qs.spy.Profile] = {}
                _step(results, folder, "profile", lambda: qs.queue_drain(
                    svc, watch, folder, args.items, args.batch, profile=got))
                results.profile = got.get("queue")
        finally:
            watch.close()


def _pickups(args: argparse.Namespace, results: QueueResults, svc: Services, pg: Postgres,
             folder: Path, program: Path) -> None:
    """Enqueue-to-start of single items, River's and asynctier's, idle then loaded."""
    n, rate = args.pickups, args.loaded_rate
    for load, count, at in (("idle", n, None), ("loaded", n * 5, rate)):
        extra = () if at is None else ("-rate", f"{at:.0f}")
        got = qs.river(program, "pickup", pg.dsn, "-jobs", str(count), *extra,
                                "-workers", str(args.river_workers))
        results.pickup[f"River {load}"] = {"n": count, "p50": float(got["pickup_p50_ms"]),
                                           "p99": float(got["pickup_p99_ms"])}
        ours = qs.asynctier_pickup(svc, pg, folder, count, at)
        results.pickup[f"asynctier {load}"] = {"n": count, **ours}
        print(f"   pickup {load}: asynctier p50 {ours['p50']:.1f} ms p99 {ours['p99']:.1f} "
              f"ms; River p50 {got['pickup_p50_ms']:.1f} ms p99 {got['pickup_p99_ms']:.1f} ms",
              flush=True)


def _want_profile(args: argparse.Namespace, results: QueueResults) -> bool:
    if args.profile == "never" or "queue" not in args.only:
        return False
    return args.profile == "always" or (not args.quick and bool(results.missed()))


def _step(results: QueueResults, folder: Path, name: str, fn: Callable[[], None]) -> None:
    started = time.monotonic()
    try:
        fn()
    except Exception as exc:  # one contender's failure is a result; the others go on
        results.errors[name] = f"{type(exc).__name__}: {exc}"
        print(f"   {name} FAILED: {exc}", flush=True)
        with open(folder / "errors.log", "a") as log:
            traceback.print_exc(file=log)
        return
    row = results.last(name)
    if row is not None:
        print(f"   {row.name}: {row.items:,} in {row.seconds:.2f} s = {row.rate:,.0f}/s, "
              f"own {queue_report.fmt(row.cpu_per_1k)} CPU-s/1k"
              + queue_report.service_cpu_text(row)
              + f" ({time.monotonic() - started:.0f} s)", flush=True)
    filled = results.last_fill(name)
    if filled is not None:
        print(f"   filled: {filled.items:,} in {filled.seconds:.2f} s = {filled.rate:,.0f}/s "
              f"(batches of {filled.batch:,})", flush=True)


def main(argv: list[str]) -> int:
    """Run the benchmark; 0 when it ran (missed goals are results, not errors)."""
    args = parse(argv)
    folder = Path(tempfile.mkdtemp(prefix="asynctier-qbench-logs-"))
    print(f"logs in {folder}", flush=True)
    command = "python bench/queue_drain.py" + ("" if not argv else " " + shlex.join(argv))
    results = QueueResults(machine(), command, {
        "mode": "quick (small sizes)" if args.quick else "full",
        "sizes": f"{args.items:,} queue items and Kafka records, {args.peer_items:,} "
                 f"Procrastinate jobs; enqueue and defer batches of {args.batch:,}",
        "rounds": f"{args.rounds} measured (+{args.warmup_rounds} warm-up, discarded)",
        "load average at start (1, 5, 15 min)": _load()})
    started = time.monotonic()
    run(args, results, folder)
    results.settings["load average at end (1, 5, 15 min)"] = _load()
    results.settings["wall time"] = f"{time.monotonic() - started:.0f} s"
    section = queue_report.render(results)
    if args.out is not None:
        queue_report.write_section(args.out, section)
        print(f"wrote the queue drain's section of {args.out}")
    else:
        print(section)
    print(queue_report.final_line(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

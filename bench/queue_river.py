"""asynctier's queue beside River (Go, PostgreSQL), on the same PostgreSQL and two cores.

    .venv/bin/python -m bench.queue_river [--items 100000] [--rounds 3] [--workers 2000]

River v0.51.2 with its pgx driver (``bench/river``, built here with the Go toolchain from
the module proxy; its schema migrated by River's own migrator into schema ``river``).
Each round, interleaved: asynctier's queue filled ``--batch`` items a call
(``QueueStore.enqueue``) and drained by a default ``asynctier run`` (the default binding,
then ``--idempotent``: River has no run-once guard), then River's ``InsertManyFast`` (COPY) of the
same number of no-op jobs and its client's drain of them (``--workers`` MaxWorkers,
GOMAXPROCS 2: the machine's two cores, as asynctier's processes get; FetchCooldown 2 ms and
FetchPollInterval 20 ms, River's own benchmark's settings). Then pickup, the same way on
both: single items inserted one at a time at random gaps of 20-200 ms (idle), then at
``--loaded-rate`` a second; the delay from just before the insert to the function's (the
Work call's) start. asynctier's runs a default ``asynctier run`` with a queue binding to
``bench.noop:timed``.

The final line reads ``drain_vs_river=.. drain_idempotent_vs_river=.. enqueue_vs_river=..
pickup_p50_ms=.. pickup_p99_ms=.. idle_p99_vs_river=.. pickup_p99_vs_river=..``
(medians of the drain rounds; pickup: asynctier's idle, and its p99s over River's, idle
and loaded: ``pickup_p99_vs_river`` is the loaded one, as in ``bench/queue_drain.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from asynctier.queue import NewItem, QueueStore
from bench import queue_scenarios as qs
from bench.measure import BenchError
from bench.scenarios import platform
from bench.stack import Postgres, Services, postgres, services


def asynctier_pickup(svc: Services, pg: Postgres, folder: Path, n: int,
                     rate: float | None) -> dict[str, float]:
    """p50/p99 ms from just before each single enqueue to its function's start, through a
    default ``asynctier run``: random idle gaps, or ``rate`` a second."""
    topic = f"bench-pick-{uuid.uuid4().hex[:6]}"
    samples = folder / f"{topic}.samples"
    env = {"ASYNCTIER_QUEUE_SHARDS": pg.dsn, "BENCH_LATENCY_FILE": str(samples)}
    rng = random.Random(7)
    with platform(svc, folder, "pickup", env) as run, QueueStore(pg.dsn, pool_size=1) as store:
        run.bind_queue("qpick", topic, "timed", "--tenant", qs.NAMESPACE, "--idempotent")
        run.start()

        def left() -> int:
            return sum(c.ready + c.leased + c.delayed for c in store.counts(qs.NAMESPACE, topic))

        store.enqueue(qs.NAMESPACE, [NewItem(topic, json.dumps({"t0": time.time(),
                                                                "warmup": True}).encode())])
        deadline = time.monotonic() + 60
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(n):
            time.sleep(1 / rate if rate else rng.uniform(0.02, 0.2))
            store.enqueue(qs.NAMESPACE, [NewItem(topic, json.dumps({"t0": time.time()}
                                                                   ).encode())])
        deadline = time.monotonic() + 60
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
    ms = sorted(float(line.split()[1]) for line in samples.read_text().splitlines())
    if len(ms) < n:
        raise BenchError(f"asynctier pickup: {len(ms)} of {n} items started; see {run.log}")
    return {"p50": ms[len(ms) // 2], "p99": ms[min(len(ms) - 1, len(ms) * 99 // 100)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--pickups", type=int, default=200)
    parser.add_argument("--loaded-rate", type=float, default=500.0)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {k: [] for k in (
        "queue", "queue_idempotent", "enqueue", "river", "river_insert")}
    with tempfile.TemporaryDirectory(prefix="asynctier-river-") as tmp, services() as svc, \
            postgres() as pg:
        folder = Path(tmp)
        program = qs.build_river(folder)
        watch = qs.PgWatch(pg)
        try:
            for number in range(args.rounds):
                row, filled = qs.queue_drain(svc, watch, folder, args.items, args.batch)
                idem, _ = qs.queue_drain(svc, watch, folder, args.items, args.batch,
                                         idempotent=True)
                got = qs.river(program, "drain", pg.dsn, "-jobs", str(args.items), "-batch",
                            str(args.batch), "-workers", str(args.workers))
                watch.vacuum(*qs.QUEUE_TABLES)
                rates["queue"].append(row.rate)
                rates["queue_idempotent"].append(idem.rate)
                rates["enqueue"].append(filled.rate)
                rates["river"].append(float(got["drain_per_s"]))
                rates["river_insert"].append(float(got["insert_per_s"]))
                print(f"round {number + 1}: asynctier queue drain {row.rate:,.0f}/s "
                      f"(--idempotent {idem.rate:,.0f}/s), enqueue {filled.rate:,.0f}/s; "
                      f"River drain {got['drain_per_s']:,.0f}/s, InsertManyFast "
                      f"{got['insert_per_s']:,.0f}/s", flush=True)
            idle = qs.river(program, "pickup", pg.dsn, "-jobs", str(args.pickups),
                         "-workers", str(args.workers))
            loaded = qs.river(program, "pickup", pg.dsn, "-jobs", str(args.pickups * 5),
                           "-rate", f"{args.loaded_rate:.0f}", "-workers", str(args.workers))
            ours_idle = asynctier_pickup(svc, pg, folder, args.pickups, None)
            ours_loaded = asynctier_pickup(svc, pg, folder, args.pickups * 5,
                                           args.loaded_rate)
        finally:
            watch.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"pickup idle ({args.pickups} single items): asynctier p50 {ours_idle['p50']:.1f} "
          f"ms p99 {ours_idle['p99']:.1f} ms; River p50 {idle['pickup_p50_ms']:.1f} ms p99 "
          f"{idle['pickup_p99_ms']:.1f} ms")
    print(f"pickup at {args.loaded_rate:,.0f}/s ({args.pickups * 5} single items): asynctier "
          f"p50 {ours_loaded['p50']:.1f} ms p99 {ours_loaded['p99']:.1f} ms; River p50 "
          f"{loaded['pickup_p50_ms']:.1f} ms p99 {loaded['pickup_p99_ms']:.1f} ms")
    print(f"drain_vs_river={med['queue'] / med['river']:.2f} "
          f"drain_idempotent_vs_river={med['queue_idempotent'] / med['river']:.2f} "
          f"enqueue_vs_river={med['enqueue'] / med['river_insert']:.2f} "
          f"pickup_p50_ms={ours_idle['p50']:.1f} pickup_p99_ms={ours_idle['p99']:.1f} "
          f"idle_p99_vs_river={ours_idle['p99'] / idle['pickup_p99_ms']:.2f} "
          f"pickup_p99_vs_river={ours_loaded['p99'] / loaded['pickup_p99_ms']:.2f}")


if __name__ == "__main__":
    main()

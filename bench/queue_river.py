"""asynctier's queue beside River (Go, PostgreSQL), on the same PostgreSQL and two cores.

    .venv/bin/python -m bench.queue_river [--items 100000] [--rounds 3] [--workers 2000]

River v0.51.2 with its pgx driver (``bench/river``, built here with the Go toolchain from
the module proxy; its schema migrated by River's own migrator into schema ``river``).
Each round, interleaved: asynctier's queue filled ``--batch`` items a call
(``QueueStore.enqueue``) and drained by a default ``asynctier run`` (the default binding,
then ``--idempotent``: River has no run-once guard), then River's ``InsertManyFast`` (COPY) of the
same number of no-op jobs and its client's drain of them (``--workers`` MaxWorkers,
GOMAXPROCS 2: the machine's two cores, as asynctier's processes get; FetchCooldown 2 ms and
FetchPollInterval 20 ms, River's own benchmark's settings). Then pickup, River's
client idle (single jobs at random gaps of 20-200 ms) and at half its drain rate: the
delay from an insert's return to its Work call; asynctier's idle pickup is
``bench.queue_pickup`` (at its lease, not its function: said beside it).

The final line reads ``drain_vs_river=.. drain_idempotent_vs_river=.. enqueue_vs_river=..
river_pickup_p50_ms=.. river_pickup_p99_ms=.. river_loaded_p99_ms=..`` (medians of rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench import queue_scenarios as qs
from bench.stack import postgres, services

RIVER = Path(__file__).resolve().parent / "river"


def build(folder: Path) -> Path:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--pickups", type=int, default=200)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {k: [] for k in (
        "queue", "queue_idempotent", "enqueue", "river", "river_insert")}
    with tempfile.TemporaryDirectory(prefix="asynctier-river-") as tmp, services() as svc, \
            postgres() as pg:
        folder = Path(tmp)
        program = build(folder)
        watch = qs.PgWatch(pg)
        try:
            for number in range(args.rounds):
                row, filled = qs.queue_drain(svc, watch, folder, args.items, args.batch)
                idem, _ = qs.queue_drain(svc, watch, folder, args.items, args.batch,
                                         idempotent=True)
                got = river(program, "drain", pg.dsn, "-jobs", str(args.items), "-batch",
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
            river_drain = statistics.median(rates["river"])
            idle = river(program, "pickup", pg.dsn, "-jobs", str(args.pickups),
                         "-workers", str(args.workers))
            loaded = river(program, "pickup", pg.dsn, "-jobs", str(args.pickups * 10),
                           "-rate", f"{river_drain / 2:.0f}", "-workers", str(args.workers))
        finally:
            watch.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"River pickup idle: p50 {idle['pickup_p50_ms']:.1f} ms p99 "
          f"{idle['pickup_p99_ms']:.1f} ms ({idle['picked']} jobs); at {river_drain / 2:,.0f}/s: "
          f"p50 {loaded['pickup_p50_ms']:.1f} ms p99 {loaded['pickup_p99_ms']:.1f} ms "
          f"({loaded['picked']} jobs)")
    print(f"drain_vs_river={med['queue'] / med['river']:.2f} "
          f"drain_idempotent_vs_river={med['queue_idempotent'] / med['river']:.2f} "
          f"enqueue_vs_river={med['enqueue'] / med['river_insert']:.2f} "
          f"river_pickup_p50_ms={idle['pickup_p50_ms']:.1f} "
          f"river_pickup_p99_ms={idle['pickup_p99_ms']:.1f} "
          f"river_loaded_p99_ms={loaded['pickup_p99_ms']:.1f}")


if __name__ == "__main__":
    main()

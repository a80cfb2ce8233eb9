"""What the queue costs as it grows (issue 46): drain rate and pickup at 10k, 100k and 1M
items ready, and the drain of ready items beside 1M delayed into the future.

    .venv/bin/python -m bench.queue_scale [--sizes 10000,100000,1000000] [--delayed 1000000]
                                          [--ready 100000] [--rounds 3] [--pickups 100]

On one PostgreSQL (started by the run unless ``ASYNCTIER_QUEUE_SHARDS`` names one), Kafka
and Redis as in ``bench/run.py``:

- **ready N**: for each size, a fresh queue topic filled with N items (batches of 1,000)
  and drained by a default ``asynctier run`` (a binding ``--queue`` to
  ``bench.noop:noop``); then N items are left ready in a topic nobody is bound to, and
  ``--pickups`` single items are enqueued one at a time (random gaps of 20-200 ms) to an
  idle bound topic: p50 and p99 from just before the enqueue to the function's start
  (``bench.queue_scenarios.asynctier_pickup``). The table holds N more items than the pickup's
  topic needs: what a large backlog elsewhere costs an idle binding.
- **delayed**: ``--delayed`` items enqueued once, due in a day, in topic D. Then, in
  ``--rounds`` interleaved rounds (every other one in reverse order), ``--ready`` ready
  items drained from a fresh topic, and ``--ready`` ready items drained from D, beside its
  delayed ones. ``delayed_drain_ratio`` is the median over the rounds of D's rate over the
  fresh topic's (goal: >= 0.9, the ready ones not slowed by the delayed).

Prints one line per measure and the final line ``ready_<N>_per_s=.. pickup_<N>_p50_ms=..
pickup_<N>_p99_ms=.. delayed_drain_ratio=..``. Writes nothing: the figures go to
bench/RESULTS.md by hand, with this command.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench import queue_scenarios as qs
from bench.queue_scenarios import asynctier_pickup
from bench.stack import postgres, services

#: Delayed items are due this far ahead: never during the run.
DELAY_S = 86_400.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--delayed", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pickups", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    final: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="asynctier-qscale-") as tmp, services() as svc, \
            postgres() as pg:
        folder = Path(tmp)
        watch = qs.PgWatch(pg)
        try:
            for size in sizes:
                row, filled = qs.queue_drain(svc, watch, folder, size, args.batch)
                print(f"ready {size:,}: drained at {row.rate:,.0f}/s (filled at "
                      f"{filled.rate:,.0f}/s)", flush=True)
                idle = f"bench-idle-{uuid.uuid4().hex[:6]}"
                qs.enqueue(pg.dsn, idle, size, args.batch)
                watch.vacuum(*qs.QUEUE_TABLES)
                pick = asynctier_pickup(svc, pg, folder, args.pickups, None)
                print(f"   pickup beside {size:,} ready items elsewhere: p50 "
                      f"{pick['p50']:.1f} ms, p99 {pick['p99']:.1f} ms", flush=True)
                watch.conn.execute("DELETE FROM asynctier_queue_items WHERE namespace = %s "
                                   "AND topic = %s", (qs.NAMESPACE, idle))
                watch.vacuum(*qs.QUEUE_TABLES)
                final[f"ready_{size}_per_s"] = f"{row.rate:.0f}"
                final[f"pickup_{size}_p50_ms"] = f"{pick['p50']:.1f}"
                final[f"pickup_{size}_p99_ms"] = f"{pick['p99']:.1f}"
            delayed_topic = f"bench-delayed-{uuid.uuid4().hex[:6]}"
            started = time.monotonic()
            qs.enqueue(pg.dsn, delayed_topic, args.delayed, args.batch, delay_s=DELAY_S)
            watch.vacuum(*qs.QUEUE_TABLES)
            print(f"{args.delayed:,} items delayed by a day in {delayed_topic} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
            ratios = []
            for number in range(args.rounds):
                order = ("plain", "beside") if number % 2 == 0 else ("beside", "plain")
                rates = {}
                for kind in order:
                    topic = delayed_topic if kind == "beside" else None
                    row, _ = qs.queue_drain(svc, watch, folder, args.ready, args.batch,
                                            topic=topic, later=topic is not None)
                    watch.vacuum(*qs.QUEUE_TABLES)
                    rates[kind] = row.rate
                ratios.append(rates["beside"] / rates["plain"])
                print(f"round {number + 1}: {args.ready:,} ready drained at "
                      f"{rates['plain']:,.0f}/s alone, {rates['beside']:,.0f}/s beside "
                      f"{args.delayed:,} delayed: {ratios[-1]:.2f}", flush=True)
            final["delayed_drain_ratio"] = f"{statistics.median(ratios):.2f}"
        finally:
            watch.close()
    print(" ".join(f"{k}={v}" for k, v in final.items()))


if __name__ == "__main__":
    main()

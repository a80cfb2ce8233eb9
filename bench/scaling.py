"""How asynctier's cost grows with work (issue 30, point 5).

    python -m bench.scaling [--backlogs 10000,100000,1000000] [--bindings 1,4,16]
                            [--total 160000] [--rounds 1]

Two series, each drained by the default ``asynctier run`` (no-op function, default
binding: run-once guard on) on a fresh prefix:

* **backlog**: one binding over one preloaded topic of N records, for each N;
* **bindings**: B bindings active at once, each over its own topic of ``total / B``
  records, so every row does the same total work.

The platform starts warm: each topic first gets :data:`WARMUP` records, and only once
every binding has committed them is the backlog written (the producer outruns the drain
many times over, so the platform meets a backlog). Each row gives the drain time (from the
start of the backlog's writing to the last record committed), records per second, and the
CPU seconds per 1,000 records of asynctier's processes (the whole ``asynctier run`` tree)
and of Kafka + Redis over that window: start-up is not in it, and nothing but the drain
is. The last line,
``cpu_growth_backlog=`` and ``cpu_growth_bindings=``, is the largest row's CPU per record
over the smallest's: flat is 1.0, and the issue's goal for bindings is at most 1.2.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.asynctier_run import AsynctierRun
from bench.measure import Drain, Meter, single, tree, watch_drain
from bench.records import GroupProgress, preload
from bench.stack import Services, services

#: Records each topic gets before the measured backlog, to start the platform warm.
WARMUP = 1000


def drain(svc: Services, folder: Path, label: str, topics: dict[str, int],
          timeout_s: float) -> Drain:
    """Bind one no-op binding per topic (``topic -> records``), start the platform warm,
    write the backlogs and watch every binding's group commit its topic to the end."""
    run = AsynctierRun(svc, folder, label)
    names = {topic: f"b{n}" for n, topic in enumerate(topics)}
    for topic, name in names.items():
        preload(svc.kafka_bootstrap, topic, WARMUP)
        run.bind(name, topic, "noop")
    run.start()
    progress = [GroupProgress(svc.kafka_bootstrap, run.group(name), topic)
                for topic, name in names.items()]
    assert run.proc is not None
    meter = Meter({"asynctier": tree(run.proc.pid),
                   "services": lambda: [*single(svc.kafka_pid)(), *single(svc.redis_pid)()]})
    warm = WARMUP * len(topics)
    try:
        watch_drain(lambda: sum(p.committed() for p in progress), warm, meter, timeout_s,
                    poll_s=0.2, check=run.check())
        meter.sample()
        cpu0, t0 = meter.cpu(), time.monotonic()
        for topic, n in topics.items():
            preload(svc.kafka_bootstrap, topic, n)
        done = watch_drain(lambda: sum(p.committed() for p in progress),
                           warm + sum(topics.values()), meter, timeout_s, poll_s=0.2,
                           check=run.check())
        cpu1 = meter.cpu()
        return Drain(sum(topics.values()), time.monotonic() - t0,
                     {k: cpu1[k] - cpu0[k] for k in cpu1}, done.peak_rss)
    finally:
        run.stop()
        for p in progress:
            p.close()


def row(what: str, d: Drain) -> tuple[str, float]:
    """A table row, and the asynctier CPU seconds per 1,000 records."""
    own = d.cpu_s["asynctier"] * 1000 / max(d.items, 1)
    svc = d.cpu_s["services"] * 1000 / max(d.items, 1)
    return (f"| {what} | {d.items:,} | {d.seconds:.1f} | {d.rate:,.0f} | {own:.3f} | "
            f"{svc:.3f} |"), own


def series(svc: Services, folder: Path, rows: list[tuple[str, dict[str, int]]],
           rounds: int, timeout_s: float) -> tuple[list[str], list[float]]:
    """Each row drained ``rounds`` times (fresh topics each time); the lines and the CPU
    per 1,000 records of each row (the median over rounds)."""
    lines: list[str] = []
    costs: list[float] = []
    for what, sizes in rows:
        got: list[tuple[str, float]] = []
        for r in range(rounds):
            topics = {f"bench-scale-{uuid.uuid4().hex[:8]}": n for n in sizes.values()}
            got.append(row(what, drain(svc, folder, f"s{len(lines)}r{r}", topics, timeout_s)))
            print(got[-1][0], flush=True)
        got.sort(key=lambda g: g[1])
        line, cost = got[len(got) // 2]
        lines.append(line)
        costs.append(cost)
    return lines, costs


def main() -> None:
    """Run both series and print their tables and the final line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlogs", default="10000,100000,1000000")
    parser.add_argument("--bindings", default="1,4,16")
    parser.add_argument("--total", type=int, default=160_000,
                        help="records over all bindings in the bindings series")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200.0)
    args = parser.parse_args()
    backlogs = [int(n) for n in args.backlogs.split(",") if n]
    bindings = [int(n) for n in args.bindings.split(",") if n]
    head = ("| {} | records | drain s | records/s | asynctier CPU-s/1k | Kafka + Redis "
            "CPU-s/1k |\n|---|--:|--:|--:|--:|--:|")
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with services() as svc, tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        folder = Path(tmp)
        backlog_lines, backlog_cost = series(
            svc, folder, [(f"1 binding, {n:,} backlog", {"t": n}) for n in backlogs],
            args.rounds, args.timeout)
        binding_lines, binding_cost = series(
            svc, folder, [(f"{b} binding(s) x {args.total // b:,}",
                           {f"t{i}": args.total // b for i in range(b)}) for b in bindings],
            args.rounds, args.timeout)
    print("\n" + head.format("backlog"))
    print("\n".join(backlog_lines))
    print("\n" + head.format("bindings at once"))
    print("\n".join(binding_lines))
    print(f"\ncpu_growth_backlog={max(backlog_cost) / min(backlog_cost):.2f} "
          f"cpu_growth_bindings={binding_cost[-1] / binding_cost[0]:.2f}")


if __name__ == "__main__":
    main()

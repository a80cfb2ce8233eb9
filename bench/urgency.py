"""Urgent work, a small tenant and near deadlines behind a flood (issue 50).

    python -m bench.urgency [--cases all|same,tenant,...] [--backlog 300000]
                            [--rate 30] [--seconds 10] [--start-after 8]
                            [--spread SCHEDULERS,TAILERS] [--stages] [--cpu-waits]
                            [--out FILE]

One ``asynctier run`` per measurement (``--spread``: each component in a process of its
own, S schedulers of every tier and S kept for the urgent tier, T tailers processes per
priority tier). A *bulk* binding drains a backlog whose function
waits 2 ms (``time.sleep``), or keeps the CPU busy 0.2 ms (the ``cpu`` case). Once it is
under way, ``--start-after`` seconds after the start and once both bindings' groups are
stable with every tailers process holding partitions (no rebalance during the window: with
``--spread``, the second process joins seconds later), the probe binding's own topic (4
partitions) receives
``--rate`` records a second for ``--seconds``, each carrying its due time; the probe
function notes start minus due time. Each case is measured alone (no bulk binding) and
under the backlog; the ratio is p99 under the backlog over p99 alone.

``--stages``: where each probe record's time went, read from the platform's own traces
(tracing on, spans to a Jaeger of its own): the probe records alone are traced (each
carries a sampled ``traceparent``; the sample ratio is 0 for the rest), from their
produce to the tailer adding them to a call (``read`` span starts), the call sent (it
ends), the scheduler taking them (``process`` starts) and the function's start (``run``).

``--cpu-waits``: how long each process of the machine waited for a core in the window,
from the kernel's scheduler statistics (:mod:`bench.cpu_waits`). The final line is for
scripts::

    urgent_p99_ratio=1.4 urgent_p99_ratio_cpu=2.1 tenant_p99_ratio=1.2 deadline_met=1.000 \
        drain_ratio=0.97

``urgent_p99_ratio``: the worst of the I/O cases where the probe is urgent (same tenant,
other tenant, async, deferring bulk); ``tenant_p99_ratio``: the small tenant's case;
``deadline_met``: the share of the ``--start-within 2s`` probe's records that started
within 2 s; ``drain_ratio``: the bulk binding's drain rate during the probe window of the
``same`` case over its rate in the same window with no probe.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.jaeger import JaegerNode
from asynctier.dev.testing import start_test_jaeger
from bench import cpu_waits
from bench.measure import BenchError, python_speed, write_section
from bench.pickup_stages import TRACING_ENV, percentile, read_stages, step_times
from bench.records import GroupProgress, create_topic, open_loop, preload, warm_producer
from bench.scenarios import Latency, _read_latency, platform
from bench.stack import Services, services

REPO = Path(__file__).resolve().parent.parent
WARM = 20  # probe records sent before the window (not measured): the probe tailer is up
DEADLINE_S = 2.0


@dataclass(frozen=True)
class Case:
    """One row: how the bulk and the probe bindings are bound."""

    key: str
    title: str
    probe_function: str = "timed"
    probe_args: tuple[str, ...] = ("--priority", "urgent")
    bulk_function: str = "sleep2ms"
    bulk_args: tuple[str, ...] = ("--priority", "batch")
    config: str = ""  # the run's config file (TOML), when it needs one


CASES: tuple[Case, ...] = (
    Case("same", "both in tenant default, sync urgent function"),
    Case("tenant", "urgent in tenant live, batch in growth",
         probe_args=("--priority", "urgent", "--tenant", "live"),
         bulk_args=("--priority", "batch", "--tenant", "growth")),
    Case("async", "urgent function async def", probe_function="atimed"),
    Case("defer", "batch bound --defer-when-busy --start-within 2h",
         bulk_args=("--priority", "batch", "--defer-when-busy", "--start-within", "2h")),
    Case("cpu", "batch function CPU-bound (0.2 ms busy loop)", bulk_function="burn"),
    Case("cpu-threads", "the same, kept in threads ([scheduler] cpu_bound_item_ms = 0)",
         bulk_function="burn", config="[scheduler]\ncpu_bound_item_ms = 0\n"),
    Case("small", "both normal: tenant small at the rate behind tenant big's backlog",
         probe_args=("--priority", "normal", "--tenant", "small"),
         bulk_args=("--priority", "normal", "--tenant", "big")),
    Case("deadline", "the same, the small binding bound --start-within 2s",
         probe_args=("--priority", "normal", "--tenant", "small", "--start-within", "2s"),
         bulk_args=("--priority", "normal", "--tenant", "big")),
)
IO_URGENT = ("same", "tenant", "async", "defer")


@dataclass
class Measured:
    """One run: the probe's latencies, and the bulk's drain during the window."""

    latency: Latency
    bulk_rate: float | None = None  # records/s committed by the bulk group in the window
    bulk_left: int | None = None  # bulk records not committed when the window closed
    stages: list[list[float]] | None = None  # --stages: ms to each of STAGES, per record
    waits: list[str] = field(default_factory=list)  # --cpu-waits: the window's table


#: The probe's stages with ``--stages`` (the steps between them are what the table shows).
STAGES = ("produce to the tailer's call (read starts)", "the call built and sent (read ends)",
          "the RPC, to the scheduler (process starts)", "door, queue, worker (run starts)")


@dataclass
class Row:
    """A case alone and under the backlog."""

    case: Case
    alone: Measured
    loaded: Measured
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """p99 under the backlog over p99 alone."""
        return self.loaded.latency.percentile(99) / self.alone.latency.percentile(99)


def _wait(what: str, done: object, timeout_s: float, check: object) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not done after {timeout_s:g} s")
        check()  # type: ignore[operator]
        time.sleep(0.05)


def measure(svc: Services, folder: Path, case: Case, bulk_topic: str | None,
            backlog: int, args: argparse.Namespace, probe: bool = True,
            jaeger: JaegerNode | None = None) -> Measured:
    """One ``asynctier run``: the probe alone (``bulk_topic`` None), the probe under the
    bulk backlog, or (``probe`` False) the bulk alone over the same window. With
    ``jaeger``, the probe records are traced and their stages read back."""
    boot = svc.kafka_bootstrap
    topic = f"bench-urgent-{uuid.uuid4().hex[:6]}"
    create_topic(boot, topic)
    samples = folder / f"urgency-{case.key}-{uuid.uuid4().hex[:6]}.txt"
    label = f"urgency-{case.key}-{'loaded' if bulk_topic else 'alone'}"
    env = {"BENCH_LATENCY_FILE": str(samples)}
    traced: dict[str, float] = {}  # the probe records' trace ids, and when each was produced
    base = uuid.uuid4().int >> 32  # 96 bits: each run's trace ids its own

    def traceparent(n: int) -> list[tuple[str, bytes]]:
        trace_id = f"{base:024x}{n:08x}"
        traced[trace_id] = time.time()
        return [("traceparent", f"00-{trace_id}-{n + 1:016x}-01".encode())]

    if jaeger is not None:
        env.update({**TRACING_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.endpoint,
                    "OTEL_TRACES_SAMPLER_ARG": "0"})
    if case.config:
        config = folder / f"{label}.toml"
        config.write_text(case.config)
        env["ASYNCTIER_CONFIG"] = str(config)
    with platform(svc, folder, label, env) as run:
        run.bind("probe", topic, case.probe_function, *case.probe_args)
        producer = warm_producer(boot, topic, WARM)
        probe_group = GroupProgress(boot, run.group("probe"), topic)
        bulk_group: GroupProgress | None = None
        if bulk_topic is not None:
            run.bind("bulk", bulk_topic, case.bulk_function, *case.bulk_args)
            bulk_group = GroupProgress(boot, run.group("bulk"), bulk_topic)
        try:
            if args.spread:
                run.start_spread(*args.spread)
            else:
                run.start()
            check = run.check()
            started = time.monotonic()
            tailers = args.spread[1] if args.spread else 1
            groups = [g for g in (probe_group, bulk_group) if g is not None]
            _wait("the platform's start", lambda: time.monotonic() - started > args.start_after
                  and all(g.settled(tailers) for g in groups), args.start_after + 60, check)
            before = bulk_group.committed() if bulk_group is not None else 0
            counters = cpu_waits.snapshot() if args.cpu_waits else None
            opened = time.monotonic()
            if probe:
                produced = open_loop(producer, topic, args.rate, args.seconds,
                                     headers_of=traceparent if jaeger is not None else None)
            else:
                time.sleep(args.seconds)
                produced = 0
            window = time.monotonic() - opened
            waits = [] if counters is None else cpu_waits.lines(
                cpu_waits.between(counters, cpu_waits.snapshot()), window)
            after = bulk_group.committed() if bulk_group is not None else 0
            _wait("the probe's records", lambda: probe_group.committed() >= WARM + produced,
                  300, check)
            stages = (read_stages(jaeger, traced, "probe", f"see {run.log}")
                      if jaeger is not None and probe else None)
        finally:
            probe_group.close()
            if bulk_group is not None:
                bulk_group.close()
    time.sleep(0.2)
    latency = _read_latency(args.rate, args.seconds, produced, samples)
    if probe and len(latency.samples) < produced:
        raise BenchError(f"{label}: {len(latency.samples)} samples of {produced} records")
    if bulk_group is None:
        return Measured(latency, stages=stages, waits=waits)
    return Measured(latency, (after - before) / window, backlog - after, stages, waits)


def run_cases(svc: Services, folder: Path, cases: Sequence[Case], args: argparse.Namespace,
              jaeger: JaegerNode | None = None) -> tuple[list[Row], float | None]:
    """Every case alone and under the backlog; the drain ratio when ``same`` ran."""
    bulk_topic = f"bench-bulk-{uuid.uuid4().hex[:6]}"
    print(f"preloading {args.backlog:,} records into {bulk_topic}", flush=True)
    preload(svc.kafka_bootstrap, bulk_topic, args.backlog)
    rows: list[Row] = []
    drain_ratio: float | None = None
    for case in cases:
        alone = measure(svc, folder, case, None, args.backlog, args, jaeger=jaeger)
        loaded = measure(svc, folder, case, bulk_topic, args.backlog, args, jaeger=jaeger)
        row = Row(case, alone, loaded)
        rows.append(row)
        print(_line(row), flush=True)
        for name, measured in (("alone", alone), ("under the backlog", loaded)):
            if measured.waits:
                print(f"  waits for a core in the window, {name}:", *measured.waits,
                      sep="\n", flush=True)
        if case.key == "same":
            bulk_alone = measure(svc, folder, case, bulk_topic, args.backlog, args,
                                 probe=False)
            if bulk_alone.bulk_rate and loaded.bulk_rate:
                drain_ratio = loaded.bulk_rate / bulk_alone.bulk_rate
                print(f"  bulk drain in the window: {loaded.bulk_rate:,.0f}/s with the "
                      f"probe, {bulk_alone.bulk_rate:,.0f}/s without: {drain_ratio:.2f}",
                      flush=True)
    return rows, drain_ratio


def _ms(latency: Latency) -> str:
    return f"{latency.percentile(50):,.1f} / {latency.percentile(99):,.1f}"


def _line(row: Row) -> str:
    left = row.loaded.bulk_left
    return (f"{row.case.key:9} alone {_ms(row.alone.latency):>18} ms   under the backlog "
            f"{_ms(row.loaded.latency):>20} ms   ratio {row.ratio:6.2f}"
            + (f"   bulk {row.loaded.bulk_rate:,.0f}/s, {left:,} left"
               if left is not None and row.loaded.bulk_rate is not None else ""))


def summary(rows: Sequence[Row], drain_ratio: float | None) -> dict[str, float]:
    """The final line's figures (nan where a case did not run)."""
    by = {r.case.key: r for r in rows}
    nan = float("nan")
    io = [by[k].ratio for k in IO_URGENT if k in by]
    deadline = by.get("deadline")
    met = nan
    if deadline is not None:
        samples = deadline.loaded.latency.samples
        met = sum(s <= DEADLINE_S * 1000 for s in samples) / len(samples)
    return {
        "urgent_p99_ratio": max(io) if io else nan,
        "urgent_p99_ratio_cpu": by["cpu"].ratio if "cpu" in by else nan,
        "tenant_p99_ratio": by["small"].ratio if "small" in by else nan,
        "deadline_met": met,
        "drain_ratio": drain_ratio if drain_ratio is not None else nan,
    }


def markdown(rows: Sequence[Row], figures: dict[str, float], args: argparse.Namespace,
             speed: float) -> str:
    """The RESULTS.md section."""
    spread = f" --spread {args.spread[0]},{args.spread[1]}" if args.spread else ""
    title = "Urgent work behind a flood (issue 50)" + (
        f", {args.spread[0]} schedulers and {args.spread[1]} tailer processes per tier"
        if args.spread else "")
    out = [f"## {title}", "",
           f"`python -m bench.urgency --backlog {args.backlog} --rate {args.rate:g} "
           f"--seconds {args.seconds:g} --start-after {args.start_after:g}{spread}`, "
           f"{time.strftime('%Y-%m-%d')}, Python speed {speed:.1f} M loops/s. "
           f"p50 / p99 record-to-start of {int(args.rate * args.seconds)} probe records, "
           "in ms; the bulk binding's backlog drains meanwhile.", "",
           "| case | alone | under the backlog | p99 ratio | bulk drain in the window |",
           "|---|--:|--:|--:|--:|"]
    for r in rows:
        bulk = (f"{r.loaded.bulk_rate:,.0f}/s" if r.loaded.bulk_rate is not None else "")
        out.append(f"| {r.case.title} | {_ms(r.alone.latency)} | {_ms(r.loaded.latency)} "
                   f"| {r.ratio:.2f} | {bulk} |")
    out += stage_lines(rows)
    out += ["", "```", final_line(figures), "```", ""]
    return "\n".join(out)


def stage_lines(rows: Sequence[Row]) -> list[str]:
    """With ``--stages``: each step of the probe's records, p50 / p99 in ms."""
    traced = [(r.case.title, load, m.stages) for r in rows
              for load, m in (("alone", r.alone), ("under the backlog", r.loaded)) if m.stages]
    if not traced:
        return []
    out = ["", "Where the probe records' time went (ms, p50 / p99 of each step, from their "
           "traces):", "", "| case | load | " + " | ".join(STAGES) + " |",
           "|---|---|" + "--:|" * len(STAGES)]
    for title, load, stages in traced:
        out.append(f"| {title} | {load} | " + " | ".join(
            f"{percentile(s, 50):,.1f} / {percentile(s, 99):,.1f}"
            for s in step_times(stages)) + " |")
    return out


def final_line(figures: dict[str, float]) -> str:
    """``name=value`` pairs."""
    return " ".join(f"{k}={v:.3f}" for k, v in figures.items())


def _spread(text: str) -> tuple[int, int]:
    schedulers, _, tailers = text.partition(",")
    return int(schedulers), int(tailers or "1")


def main(argv: list[str]) -> int:
    """Run the cases and print (and write) the results."""
    p = argparse.ArgumentParser(prog="python -m bench.urgency", description=__doc__)
    p.add_argument("--cases", default="all", help="comma-separated keys, or all: "
                   + ",".join(c.key for c in CASES))
    p.add_argument("--backlog", type=int, default=300_000)
    p.add_argument("--rate", type=float, default=30.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--start-after", type=float, default=8.0)
    p.add_argument("--spread", type=_spread, metavar="S,T",
                   help="S schedulers of every tier and S of the urgent tier, T tailers "
                        "processes per tier, each on its own (and one of delay tailers), "
                        "instead of one default `asynctier run`")
    p.add_argument("--stages", action="store_true",
                   help="trace the probe records and show where their time went")
    p.add_argument("--cpu-waits", action="store_true",
                   help="show how long each process waited for a core in the window "
                        "(the kernel's schedstat: bench/cpu_waits.py)")
    p.add_argument("--out", type=Path, help="write the section into this file "
                   "(e.g. bench/RESULTS.md)")
    args = p.parse_args(argv)
    keys = [c.key for c in CASES] if args.cases == "all" else args.cases.split(",")
    unknown = set(keys) - {c.key for c in CASES}
    if unknown:
        p.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    cases = [c for c in CASES if c.key in keys]
    speed = python_speed()
    with tempfile.TemporaryDirectory(prefix="asynctier-urgency-") as tmp, services() as svc:
        print(f"logs in {tmp}", flush=True)
        jaeger = start_test_jaeger(Path(tmp) / "stack") if args.stages else None
        try:
            rows, drain_ratio = run_cases(svc, Path(tmp), cases, args, jaeger)
        finally:
            if jaeger is not None:
                jaeger.stop()
    figures = summary(rows, drain_ratio)
    if args.out is not None:
        write_section(args.out, markdown(rows, figures, args, speed))
    print(final_line(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

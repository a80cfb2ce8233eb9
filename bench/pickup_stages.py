"""Where a queue item's pickup time goes, stage by stage, read from the platform's traces.

    .venv/bin/python -m bench.pickup_stages [--items 1000] [--rate 500] [--out bench/RESULTS.md]

One default ``asynctier run`` with tracing on (spans over OTLP to a Jaeger of its own, on
loopback), a queue binding to ``bench.noop:timed``; single items enqueued at ``--rate`` a
second, one at a time, as ``make bench-queue``'s loaded pickup does. For each item, from
just before its enqueue: the enqueue's return; its ``read`` span (the tailer leased it:
start; the call that carries it was built: end); its ``process`` span's start (the
scheduler took it from the run stream); its ``run`` span's start (the function began).
Each item's trace is found by its id (a queue item's trace derives from where it was
read). The section it writes, "Queue pickup by stage", gives p50/p90/p99 per stage.

Tracing costs time of its own (every item is sampled here): the stages' shares are what
this says, the pickup's own figures are ``make bench-queue``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asynctier.dev.testing import start_test_jaeger
from asynctier.platform.tracing import trace_id_of
from asynctier.queue import NewItem, QueueStore
from bench import queue_scenarios as qs
from bench.measure import BenchError, write_section
from bench.scenarios import platform
from bench.stack import postgres, services

#: The stages, in the order an item reaches them: (label, where its time is read).
STAGES = ("enqueue returned (its commit)", "leased by the tailer (read span starts)",
          "its call built (read span ends)",
          "taken by the scheduler: the stream carried it (process span starts)",
          "function started (run span starts)")
TRACING_ENV = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "asynctier-bench",
               "OTEL_BSP_SCHEDULE_DELAY": "200"}


def stage_times(trace: dict[str, Any], binding: str) -> list[float] | None:
    """Epoch seconds of the read span's start and end, the process span's start and the run
    span's start (``run <function>``) of one item's first attempt; None when the trace
    lacks one of them."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for span in trace.get("spans", []):
        name = span.get("operationName", "")
        if name.startswith("run "):
            name = "run"
        start_s = span["startTime"] / 1e6  # Jaeger gives microseconds
        if name not in starts or start_s < starts[name]:
            starts[name] = start_s
            ends[name] = start_s + span["duration"] / 1e6
    names = (f"read {binding}", f"process {binding}", "run")
    if any(n not in starts for n in names):
        return None
    return [starts[names[0]], ends[names[0]], starts[names[1]], starts[names[2]]]


def percentile(values: list[float], share: int) -> float:
    """The ``share``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, len(ordered) * share // 100)]


def measure(items: int, rate: float, folder: Path) -> list[list[float]]:
    """Per item, milliseconds from just before its enqueue to each of :data:`STAGES`."""
    jaeger = start_test_jaeger(folder / "stack")
    try:
        with services() as svc, postgres() as pg:
            return _run(svc, pg, jaeger, items, rate, folder)
    finally:
        jaeger.stop()


def _run(svc: Any, pg: Any, jaeger: Any, items: int, rate: float,
         folder: Path) -> list[list[float]]:
    topic = f"bench-stages-{uuid.uuid4().hex[:6]}"
    env = {"ASYNCTIER_QUEUE_SHARDS": pg.dsn, **TRACING_ENV,
           "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.endpoint}
    sent: dict[str, tuple[float, float]] = {}  # item id -> (t0, enqueue returned)
    with platform(svc, folder, "stages", env) as run, QueueStore(pg.dsn, pool_size=1) as store:
        run.bind_queue("qstages", topic, "timed", "--tenant", qs.NAMESPACE, "--idempotent")
        run.start()
        warm = store.enqueue(qs.NAMESPACE, [NewItem(topic, json.dumps(
            {"t0": time.time(), "warmup": True}).encode())])[0].id
        _wait(lambda: jaeger.trace(_trace_id(topic, warm)) is not None, 60, "the warm-up's trace")
        for _ in range(items):
            time.sleep(1 / rate)
            t0 = time.time()
            [result] = store.enqueue(qs.NAMESPACE, [NewItem(topic, json.dumps({"t0": t0}
                                                                             ).encode())])
            sent[result.id] = (t0, time.time())
        found = read_stages(jaeger, {_trace_id(topic, i): t0 for i, (t0, _) in sent.items()},
                            "qstages", f"see {run.log}")
    return [[(returned - t0) * 1000, *times]
            for (t0, returned), times in zip(sent.values(), found, strict=True)]


def read_stages(jaeger: Any, traces: dict[str, float], binding: str, hint: str,
                timeout_s: float = 120.0) -> list[list[float]]:
    """Per trace id (in order), milliseconds from its ``t0`` (epoch seconds) to each of
    :func:`stage_times`' moments, once Jaeger has the whole trace; BenchError naming the
    spans seen when one is not whole within ``timeout_s``."""
    rows: list[list[float]] = []
    deadline = time.monotonic() + timeout_s
    for trace_id, t0 in traces.items():
        times, trace = None, None
        while times is None and time.monotonic() < deadline:
            trace = jaeger.trace(trace_id)
            times = stage_times(trace, binding) if trace else None
            if times is None:
                time.sleep(0.2)
        if times is None:
            seen = sorted({s.get("operationName") for s in (trace or {}).get("spans", [])})
            raise BenchError(f"trace {trace_id}: not whole in Jaeger (spans {seen}); {hint}")
        rows.append([(at - t0) * 1000 for at in times])
    return rows


def _trace_id(topic: str, item_id: str) -> str:
    return trace_id_of([], f"queue/{qs.NAMESPACE}/{topic}/{item_id}")


def _wait(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not come within {timeout_s:g} s")
        time.sleep(0.2)


def step_times(rows: list[list[float]]) -> list[list[float]]:
    """Per stage, each item's time from the stage before (the first: from its ``t0``),
    given each item's times to every stage."""
    return [[row[n] - (row[n - 1] if n else 0.0) for row in rows]
            for n in range(len(rows[0]) if rows else 0)]


def steps(rows: list[list[float]]) -> list[float]:
    """The median time each stage took after the one before it, item by item."""
    return [percentile(times, 50) for times in step_times(rows)]


def section(rows: list[list[float]], items: int, rate: float) -> str:
    """The markdown section "Queue pickup by stage"."""
    lines = ["## Queue pickup by stage (issue 46)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Repeat with "
             f"`python -m bench.pickup_stages --items {items} --rate {rate:g}`: one default "
             "`asynctier run`, tracing on (every item sampled, spans to a Jaeger of its "
             f"own), {items:,} single items enqueued at {rate:g}/s; ms from just before "
             "each enqueue to each stage.", "",
             "| stage reached | p50 | p90 | p99 | the step alone, p50 |",
             "|---|--:|--:|--:|--:|"]
    for n, (label, step) in enumerate(zip(STAGES, steps(rows), strict=True)):
        values = [row[n] for row in rows]
        lines.append(f"| {label} | {percentile(values, 50):.2f} | "
                     f"{percentile(values, 90):.2f} | {percentile(values, 99):.2f} | "
                     f"{step:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Measure, print the section and the final line (and write the section)."""
    p = argparse.ArgumentParser(prog="python -m bench.pickup_stages", description=__doc__)
    p.add_argument("--items", type=int, default=1000)
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--out", type=Path, help="write the section into this file "
                   "(e.g. bench/RESULTS.md)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="asynctier-stages-") as tmp:
        rows = measure(args.items, args.rate, Path(tmp))
    text = section(rows, args.items, args.rate)
    print(text)
    if args.out:
        write_section(args.out, text)
    print(" ".join(f"stage{n}_p50_ms={step:.2f}" for n, step in enumerate(steps(rows), 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

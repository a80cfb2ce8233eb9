"""What ``asynctier demo`` does, step by step (see :func:`run_demo`)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.kafka import ConfirmingProducer, admin, ensure_topics
from asynctier.platform.registry import BindingRegistry

MODULE = "asynctier.demo.functions"
LADDER = (1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Workload:
    """One demo workload: its binding and how many records it gets."""

    name: str
    function: str
    tenant: str
    priority: str
    count: int
    partitions: int


WORKLOADS = (
    Workload("upload", "encode_upload", "media", "normal", 3000, 4),
    Workload("live", "notify_live", "live", "urgent", 500, 2),
    Workload("suggest", "suggest_friends", "growth", "batch", 2000, 2),
)


@dataclass
class Tally:
    """What the ledger says so far."""

    done: set[tuple[str, int]] = field(default_factory=set)
    rejected: set[tuple[str, int]] = field(default_factory=set)
    calls: int = 0
    retried: int = 0
    latencies: list[float] = field(default_factory=list)
    first: float = 0.0
    last: float = 0.0

    def read(self, path: Path, offset: int) -> int:
        """Fold in the lines after ``offset``; return the new offset."""
        if not path.exists():
            return offset
        with path.open() as fh:
            fh.seek(offset)
            chunk = fh.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        for line in complete.splitlines():
            workload, ident, attempt, started, record, status = line.split()
            key = (workload, int(ident))
            self.calls += 1
            self.retried += int(attempt) > 1
            started_s = float(started)
            self.first = started_s if not self.first else min(self.first, started_s)
            self.last = max(self.last, started_s)
            if status == "ok":
                self.done.add(key)
                if int(attempt) == 1:
                    self.latencies.append(started_s - float(record))
            elif status == "rejected":
                self.rejected.add(key)
        return offset + len(complete)


def _records(workload: Workload, rng: random.Random) -> list[dict[str, object]]:
    docs: list[dict[str, object]] = []
    for i in range(workload.count):
        doc: dict[str, object] = {"id": i}
        if workload.name == "upload":
            roll = rng.random()
            if roll < 0.05:
                doc["flaky_until"] = 3  # fails twice, then works: two trips through delay
            elif roll < 0.06:
                doc["corrupt"] = True  # never works: a dead letter
        docs.append(doc)
    return docs


def prepare(settings: Settings, say: Callable[[str], None]) -> int:
    """Create the topics, bind the three workloads and produce their records."""
    names = settings.names
    ensure_topics(admin(settings), {f"{names.prefix}.{w.name}": (w.partitions, {})
                                    for w in WORKLOADS})
    registry = BindingRegistry(settings)
    bindings = []
    for w in WORKLOADS:
        binding = Binding(name=w.name, topic=f"{names.prefix}.{w.name}",
                          function=f"{MODULE}:{w.function}", tenant=w.tenant,
                          priority=w.priority, retry_ladder_s=LADDER,  # type: ignore[arg-type]
                          max_attempts=4, timeout_s=10.0).validate()
        registry.put(binding)
        bindings.append(binding)
        say(f"bound [bold]{w.name}[/] ({w.priority}, tenant {w.tenant}) -> {binding.function}")
    ensure_binding_topics(settings, bindings)
    producer = ConfirmingProducer(settings)
    rng = random.Random(7)
    total = 0
    for w in WORKLOADS:
        for doc in _records(w, rng):
            producer.produce(f"{names.prefix}.{w.name}", json.dumps(doc).encode(),
                             str(doc["id"]).encode())
            total += 1
    producer.confirm()
    say(f"produced {total} records, delivery confirmed")
    return total


def _start_platform(settings: Settings, ledger: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update({"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                "ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix,
                "ASYNCTIER_DEMO_LEDGER": str(ledger)})
    out = log.open("ab")
    return subprocess.Popen([sys.executable, "-m", "asynctier", "run", "--allow-module",
                             MODULE], env=env, stdout=out, stderr=out,
                            start_new_session=True)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_demo(settings: Settings, timeout_s: float = 120.0, console: Console | None = None) -> int:
    """Bind, produce, run the platform with live progress, print a summary. Returns 0 when
    every record was processed or dead-lettered in time."""
    console = console or Console()
    settings = settings.with_overrides(prefix=f"demo{int(time.time())}",
                                       allow_modules=(MODULE,))
    console.print(f"[bold]asynctier demo[/] on Kafka {settings.kafka_bootstrap}, "
                  f"Redis {settings.redis_url}, prefix {settings.prefix}")
    total = prepare(settings, console.print)
    folder = Path(tempfile.mkdtemp(prefix="asynctier-demo-"))
    ledger, log = folder / "ledger.txt", folder / "platform.log"
    expected_rejects = sum(1 for d in _records(WORKLOADS[0], random.Random(7))
                           if d.get("corrupt"))
    proc = _start_platform(settings, ledger, log)
    tally, offset = Tally(), 0
    deadline = time.monotonic() + timeout_s
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            task = progress.add_task("processing", total=total)
            while time.monotonic() < deadline and proc.poll() is None:
                offset = tally.read(ledger, offset)
                resolved = len(tally.done) + len(tally.rejected)
                progress.update(task, completed=resolved,
                                description=f"processing (retries {tally.retried})")
                if resolved >= total and len(tally.rejected) >= expected_rejects:
                    break
                time.sleep(0.25)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return _summary(console, tally, total, log)


def _summary(console: Console, tally: Tally, total: int, log: Path) -> int:
    resolved = len(tally.done) + len(tally.rejected)
    span = max(tally.last - tally.first, 1e-6)
    table = Table("", "value", title="asynctier demo: summary")
    table.add_row("records", str(total))
    table.add_row("processed", str(len(tally.done)))
    table.add_row("retried (calls after a failure)", str(tally.retried))
    table.add_row("dead letters", str(len(tally.rejected)))
    table.add_row("function calls", str(tally.calls))
    table.add_row("throughput", f"{tally.calls / span:,.0f} calls/s")
    table.add_row("record-to-start p50",
                  f"{_percentile(tally.latencies, 0.5) * 1000:.1f} ms")
    table.add_row("record-to-start p99",
                  f"{_percentile(tally.latencies, 0.99) * 1000:.1f} ms")
    console.print(table)
    if resolved < total:
        console.print(f"[red]only {resolved} of {total} records resolved in time; the "
                      f"platform's log is {log}[/]")
        return 1
    console.print("every record ran or is a dead letter (see `asynctier dlq list upload` "
                  "with ASYNCTIER_PREFIX set to the demo's prefix)")
    return 0

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
from asynctier.demo import graph, transcode
from asynctier.platform.binding import Binding, Priority
from asynctier.platform.binding_features import Execution, Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.kafka import ConfirmingProducer, admin, ensure_topics, topic_replication
from asynctier.platform.registry import BindingRegistry
from asynctier.queue.dsn import redact_dsn

MODULE = "asynctier.demo.functions"
LADDER = (1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Workload:
    """One demo workload: its binding and how many records it gets."""

    name: str
    function: str
    tenant: str
    priority: Priority
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
    #: When each queue item's first attempt started (by id).
    queue_starts: dict[int, float] = field(default_factory=dict)

    def resolved(self, queue: bool) -> int:
        """Items done or rejected: of the queue workload, or of the stream workloads."""
        return sum(1 for key in self.done | self.rejected
                   if (key[0] == transcode.NAME) == queue)

    def queue_rejected(self) -> int:
        """Queue items rejected for good."""
        return sum(1 for key in self.rejected if key[0] == transcode.NAME)

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
            if workload == transcode.NAME and int(attempt) == 1:
                self.queue_starts[key[1]] = started_s
            if status == "ok":
                self.done.add(key)
                if int(attempt) == 1 and workload != transcode.NAME:
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


def bind_all(settings: Settings, say: Callable[[str], None]) -> None:
    """Create the topics and bind the three stream workloads and the queue workload."""
    names = settings.names
    ensure_topics(admin(settings), {f"{names.prefix}.{w.name}": (w.partitions, {})
                                    for w in WORKLOADS},
                  replication=topic_replication(settings))
    registry = BindingRegistry(settings)
    bindings = []
    for w in WORKLOADS:
        binding = Binding(w.name, Source("kafka", f"{names.prefix}.{w.name}"),
                          f"{MODULE}:{w.function}", tenant=w.tenant, priority=w.priority,
                          retries=Retries(4, LADDER), execution=Execution(timeout_s=10.0)
                          ).validate()
        registry.put(binding)
        bindings.append(binding)
        say(f"bound [bold]{w.name}[/] ({w.priority}, tenant {w.tenant}) -> {binding.function}")
    ensure_binding_topics(settings, bindings)
    queued = transcode.bind(settings, LADDER)
    say(f"bound [bold]{queued.name}[/] (queue topic {queued.source.topic}, priorities "
        f"{', '.join(f'{p} {what}' for p, what in transcode.BANDS)}, tenant "
        f"{queued.tenant}) -> {queued.function}")
    graph.bind(settings, LADDER)
    say(f"bound [bold]encode[/], [bold]publish[/] (the upload graph: publish after its three "
        f"encodes) and [bold]nightly[/] (a schedule every {graph.EVERY_S} s), tenant "
        f"{graph.TENANT}")


def produce_paced(settings: Settings, rate_per_s: float, tick: Callable[[], None]) -> int:
    """Produce every workload's records, interleaved, at about ``rate_per_s``; confirmed."""
    producer = ConfirmingProducer(settings)
    rng = random.Random(7)
    queue = [(w, doc) for w in WORKLOADS for doc in _records(w, rng)]
    rng.shuffle(queue)
    started = time.monotonic()
    for sent, (w, doc) in enumerate(queue):
        producer.produce(f"{settings.prefix}.{w.name}", json.dumps(doc).encode(),
                         str(doc["id"]).encode())
        if sent % 100 == 0:
            producer.poll(0)
            tick()
            ahead = sent / rate_per_s - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    producer.confirm()
    return len(queue)


def _groups_ready(settings: Settings, timeout_s: float) -> bool:
    """True once the three bindings' consumer groups are stable (their tailers joined)."""
    client = admin(settings)
    groups = [settings.names.group(w.name) for w in WORKLOADS]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            states = [f.result(timeout=5).state.name
                      for f in client.describe_consumer_groups(groups).values()]
        except Exception:  # a group not there yet
            states = []
        if states and all(state == "STABLE" for state in states):
            return True
        time.sleep(0.25)
    return False


def dead_letters(settings: Settings) -> int:
    """How many records sit in the demo bindings' dead-letter topics."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.kafka_config(**{"group.id": f"{settings.prefix}.demo-count"}))
    try:
        return sum(consumer.get_watermark_offsets(
            TopicPartition(settings.names.dlq_topic(w.name), 0), timeout=10)[1]
            for w in WORKLOADS)
    finally:
        consumer.close()


def _start_platform(settings: Settings, ledger: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update({"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                "ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix,
                "ASYNCTIER_QUEUE_SHARDS": ",".join(settings.queue_shards),
                "ASYNCTIER_DEMO_LEDGER": str(ledger)})
    env.update({"ASYNCTIER_SCHEDULER_LISTEN": settings.scheduler_listen,
                "ASYNCTIER_SCHEDULERS": ",".join(settings.schedulers),
                "ASYNCTIER_SUBMITTER_LISTEN": settings.submitter_listen,
                "ASYNCTIER_SUBMITTERS": ",".join(settings.submitters)})
    out = log.open("ab")
    return subprocess.Popen([sys.executable, "-m", "asynctier", "run", "--allow-module",
                             MODULE], env=env, stdout=out, stderr=out,
                            start_new_session=True)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_demo(settings: Settings, timeout_s: float = 120.0, console: Console | None = None,
             rate_per_s: float = 1500.0) -> int:
    """Bind, start the platform, produce at a steady rate with live progress, print a
    summary. Returns 0 when every record was processed or dead-lettered in time."""
    console = console or Console()
    settings = settings.with_overrides(prefix=f"demo{int(time.time())}",
                                       allow_modules=(MODULE,))
    shards = ", ".join(redact_dsn(dsn) for dsn in settings.queue_shards)
    console.print(f"[bold]asynctier demo[/] on Kafka {settings.kafka_bootstrap}, "
                  f"Redis {settings.redis_display}, PostgreSQL {shards}", soft_wrap=True)
    console.print(f"its prefix: {settings.prefix} (topics, groups, Redis keys; set "
                  f"ASYNCTIER_PREFIX={settings.prefix} to look at them)", soft_wrap=True)
    bind_all(settings, console.print)
    folder = Path(tempfile.mkdtemp(prefix="asynctier-demo-"))
    ledger, log = folder / "ledger.txt", folder / "platform.log"
    total = sum(w.count for w in WORKLOADS)
    expected_rejects = sum(1 for d in _records(WORKLOADS[0], random.Random(7))
                           if d.get("corrupt"))
    proc = _start_platform(settings, ledger, log)
    tally, offset = Tally(), 0
    deadline = time.monotonic() + timeout_s
    try:
        if not _groups_ready(settings, 60.0):
            console.print(f"[red]the platform did not start; its log is {log}[/]")
            return 1
        console.print("platform running: scheduler, tailers, delay tailers")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            task = progress.add_task("processing", total=total)
            queue_task = progress.add_task("queue items", total=transcode.COUNT)

            def tick() -> None:
                nonlocal offset
                offset = tally.read(ledger, offset)
                progress.update(task, completed=tally.resolved(queue=False),
                                description=f"records (retries {tally.retried})")
                progress.update(queue_task, completed=tally.resolved(queue=True))

            enqueued = transcode.enqueue(settings)
            graph.start(settings)
            produce_paced(settings, rate_per_s, tick)
            while time.monotonic() < deadline and proc.poll() is None:
                tick()
                if (tally.resolved(queue=False) >= total
                        and len(tally.rejected) - tally.queue_rejected() >= expected_rejects
                        and tally.resolved(queue=True) >= enqueued
                        and tally.queue_rejected() >= transcode.expected_rejects()
                        and graph.progress(settings).finished):
                    break
                time.sleep(0.25)
        letters = dead_letters(settings)
        queue_dead = transcode.dead_items(settings)
        flow = graph.stop(settings)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return _summary(console, tally, total, letters, log, queue_dead, settings.prefix, flow)


def _summary(console: Console, tally: Tally, total: int, letters: int, log: Path,
             queue_dead: int, prefix: str, flow: graph.Progress) -> int:
    resolved = tally.resolved(queue=False)
    span = max(tally.last - tally.first, 1e-6)
    table = Table("", "value", title="asynctier demo: summary")
    table.add_row("records", str(total))
    table.add_row("processed", str(sum(1 for k in tally.done if k[0] != transcode.NAME)))
    table.add_row("retried (calls after a failure)", str(tally.retried))
    table.add_row("dead letters (in the dead-letter topics)", str(letters))
    table.add_row("function calls", str(tally.calls))
    table.add_row("throughput (first to last call, retries included)",
                  f"{tally.calls / span:,.0f} calls/s over {span:.1f} s")
    table.add_row("record-to-start p50 (first attempts)",
                  f"{_percentile(tally.latencies, 0.5) * 1000:.1f} ms")
    table.add_row("record-to-start p99 (first attempts)",
                  f"{_percentile(tally.latencies, 0.99) * 1000:.1f} ms")
    queue_ran = _queue_rows(table, tally, queue_dead)
    _graph_rows(table, flow)
    console.print(table)
    if resolved < total:
        console.print(f"[red]only {resolved} of {total} records resolved in time; the "
                      f"platform's log is {log}[/]")
        return 1
    if not flow.finished:
        console.print(f"[red]the upload graph or the schedule did not finish in time: {flow}; "
                      f"the platform's log is {log}[/]")
        return 1
    if queue_ran < transcode.COUNT:
        console.print(f"[red]only {queue_ran} of {transcode.COUNT} queue items resolved in "
                      f"time; the platform's log is {log}[/]")
        return 1
    console.print("every record ran or is a dead letter (see `ASYNCTIER_PREFIX="
                  f"{prefix} asynctier dlq list upload`); every queue item ran or is a dead "
                  f"item (`ASYNCTIER_PREFIX={prefix} asynctier queue dead "
                  f"{prefix}.{transcode.NAME} --namespace {transcode.TENANT}`)",
                  soft_wrap=True)
    return 0


def _graph_rows(table: Table, flow: graph.Progress) -> None:
    """The upload graph's and the schedule's rows."""
    table.add_section()
    table.add_row("uploads (3 encodes, then a publish)", str(graph.UPLOADS))
    table.add_row("uploads published (after their 3 encodes)", str(flow.published))
    table.add_row("publishes parent_failed (an encode failed)", str(flow.parent_failed))
    table.add_row(f"schedule nightly (every {graph.EVERY_S} s): ticks fired", str(flow.ticks))


def _queue_rows(table: Table, tally: Tally, queue_dead: int) -> int:
    """The queue workload's rows; returns how many of its items resolved."""
    ran = sum(1 for k in tally.done if k[0] == transcode.NAME)
    table.add_section()
    table.add_row(f"queue items ({transcode.NAME})", str(transcode.COUNT))
    table.add_row("queue items ran", str(ran))
    table.add_row("queue dead items (in the queue)", str(queue_dead))
    medians = transcode.median_starts(tally.queue_starts)
    for priority, what in transcode.BANDS:
        if priority in medians:
            table.add_row(f"queue priority {priority} ({what}): median start",
                          f"+{medians[priority]:.2f} s")
    table.add_row("queue: higher priorities started first",
                  "yes" if transcode.in_priority_order(medians) else "no")
    return ran + tally.queue_rejected()

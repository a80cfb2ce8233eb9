"""The queue drain's results: rounds, medians, its section of ``RESULTS.md`` and the
final line of ``bench/queue_drain.py``."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.queue_scenarios import Filled
from bench.scenarios import Row
from bench.spy import Profile
from bench.stack import Machine

START = "<!-- queue-drain:start (written by bench/queue_drain.py) -->"
END = "<!-- queue-drain:end -->"
#: Issue 25's goals: the queue drain against Procrastinate, and against the Kafka drain.
GOAL_VS_PROCRASTINATE = 20.0
GOAL_VS_KAFKA = 0.3
NAMES = {"queue": "asynctier queue (default binding)",
         "queue_idempotent": "asynctier queue, --idempotent",
         "kafka": "asynctier Kafka drain (default binding)",
         "kafka_idempotent": "asynctier Kafka drain, --idempotent",
         "procrastinate": "Procrastinate",
         "river": "River (Go)"}


@dataclass
class Round:
    """One round's rows and fills, by contender."""

    counted: bool
    load: str
    rows: dict[str, Row] = field(default_factory=dict)
    fills: dict[str, Filled] = field(default_factory=dict)


@dataclass
class QueueResults:
    """Everything one run measured."""

    machine: Machine
    command: str
    settings: dict[str, str]
    rounds: list[Round] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    profile: Profile | None = None
    #: enqueue-to-start ms (``p50``, ``p99``) by contender and load (``asynctier idle``...)
    pickup: dict[str, dict[str, float]] = field(default_factory=dict)

    def start_round(self, counted: bool, load: str) -> None:
        """Open a round."""
        self.rounds.append(Round(counted, load))

    def add(self, key: str, row: Row, filled: Filled | None = None) -> None:
        """Keep a contender's row (and fill) in the current round."""
        self.rounds[-1].rows[key] = row
        if filled is not None:
            self.rounds[-1].fills[key] = filled

    def last(self, key: str) -> Row | None:
        """The current round's row of ``key``."""
        return self.rounds[-1].rows.get(key) if self.rounds else None

    def last_fill(self, key: str) -> Filled | None:
        """The current round's fill of ``key``."""
        return self.rounds[-1].fills.get(key) if self.rounds else None

    def counted(self) -> list[Round]:
        """The measured rounds (not the warm-ups)."""
        return [r for r in self.rounds if r.counted]

    def rates(self, key: str) -> list[float]:
        """``key``'s drain rates over the measured rounds."""
        return [r.rows[key].rate for r in self.counted() if key in r.rows]

    def median_row(self, key: str) -> Row | None:
        """The measured round's row of ``key`` with the median rate."""
        rows = sorted((r.rows[key] for r in self.counted() if key in r.rows),
                      key=lambda row: row.rate)
        return rows[(len(rows) - 1) // 2] if rows else None

    def fill_rate(self, key: str) -> float:
        """The median enqueue (or defer) rate of ``key``."""
        got = [r.fills[key].rate for r in self.counted() if key in r.fills]
        return statistics.median(got) if got else math.nan

    def ratio(self, top: str, bottom: str) -> float:
        """The median over the measured rounds of ``top``'s rate / ``bottom``'s, each
        round's pair measured in that round."""
        got = [r.rows[top].rate / r.rows[bottom].rate for r in self.counted()
               if top in r.rows and bottom in r.rows and r.rows[bottom].rate > 0]
        return statistics.median(got) if got else math.nan

    def missed(self) -> list[str]:
        """The goals missed (or not measured)."""
        goals = {"queue_ratio_vs_procrastinate": (self.ratio("queue", "procrastinate"),
                                                  GOAL_VS_PROCRASTINATE),
                 "queue_ratio_vs_kafka": (self.ratio("queue", "kafka"), GOAL_VS_KAFKA)}
        return [k for k, (got, goal) in goals.items() if not got >= goal]


def _per_1k(row: Row, key: str) -> float | None:
    value = row.detail.get(f"cpu_s.{key}")
    if value is None or not row.items:
        return None
    return 1000.0 * value / row.items


def _brokers_per_1k(row: Row) -> float | None:
    """Kafka + Redis CPU-s per 1,000 items (the Kafka scenarios' rows carry their sum)."""
    parts = [_per_1k(row, k) for k in ("kafka", "redis")]
    if "cpu_s.postgres" not in row.detail:
        return row.broker_cpu_per_1k
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def service_cpu_text(row: Row) -> str:
    """``, PostgreSQL x, Kafka + Redis y CPU-s/1k`` for the console."""
    parts = [f"{label} {v:.3f}" for label, v in (("PostgreSQL", _per_1k(row, "postgres")),
                                                 ("Kafka + Redis", _brokers_per_1k(row)))
             if v is not None]
    return f", {', '.join(parts)} CPU-s/1k" if parts else ""


def fmt(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; ``n/a`` for none (not measured)."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _table(results: QueueResults) -> list[str]:
    lines = ["| contender | items | s | items/s (median) | min-max items/s | own CPU-s/1k "
             "| PostgreSQL CPU-s/1k | Kafka + Redis CPU-s/1k |",
             "|---|---:|---:|---:|---|---:|---:|---:|"]
    for key in NAMES:
        row = results.median_row(key)
        if row is None:
            lines.append(f"| {NAMES[key]} | - | - | - | - | - | - | - |"
                         + (f" FAILED: {results.errors[key]}" if key in results.errors
                            else ""))
            continue
        rates = results.rates(key)
        lines.append(
            f"| {NAMES[key]} | {row.items:,} | {row.seconds:.2f} | {row.rate:,.0f} "
            f"| {min(rates):,.0f}-{max(rates):,.0f} | {fmt(row.cpu_per_1k)} "
            f"| {fmt(_per_1k(row, 'postgres'))} | {fmt(_brokers_per_1k(row))} |")
    return lines


def _pick(results: QueueResults, who: str, which: str) -> float:
    return results.pickup.get(who, {}).get(which, math.nan)


def _pickups(results: QueueResults) -> list[str]:
    if not results.pickup:
        return []
    lines = ["", "Enqueue-to-start of single items (from just before the enqueue to the "
             "function's start), idle (random gaps of 20-200 ms) and loaded (a steady rate):",
             "", "| contender, load | items | p50 ms | p99 ms |", "|---|---:|---:|---:|"]
    for who, got in results.pickup.items():
        lines.append(f"| {who} | {got['n']:,.0f} | {got['p50']:.1f} | {got['p99']:.1f} |")
    return lines


def _goals(results: QueueResults) -> list[str]:
    vs_peer = results.ratio("queue", "procrastinate")
    vs_kafka = results.ratio("queue", "kafka")
    idem_kafka = results.ratio("queue_idempotent", "kafka_idempotent")
    idem_peer = results.ratio("queue_idempotent", "procrastinate")

    def verdict(got: float, goal: float) -> str:
        if math.isnan(got):
            return "not measured"
        return "met" if got >= goal else f"MISSED by {100 * (1 - got / goal):.0f}%"

    return [
        "| goal (issue 25) | measured (median of the rounds' ratios) | |",
        "|---|---:|---|",
        f"| queue drain >= {GOAL_VS_PROCRASTINATE:g}x Procrastinate | {fmt(vs_peer, 1)} "
        f"| {verdict(vs_peer, GOAL_VS_PROCRASTINATE)} |",
        f"| queue drain >= {GOAL_VS_KAFKA:g}x the Kafka drain | {fmt(vs_kafka, 2)} "
        f"| {verdict(vs_kafka, GOAL_VS_KAFKA)} |",
        f"| (both --idempotent) queue / Kafka | {fmt(idem_kafka, 2)} | reported |",
        f"| (--idempotent) queue / Procrastinate | {fmt(idem_peer, 1)} | reported |",
    ]


def _fills(results: QueueResults) -> list[str]:
    lines = ["| filling | items/s (median) | rounds |", "|---|---:|---|"]
    for key, what in (("queue", "asynctier `QueueStore.enqueue`"),
                      ("queue_idempotent", "asynctier `QueueStore.enqueue` (the "
                                           "--idempotent runs' queues)"),
                      ("procrastinate", "Procrastinate `Task.batch_defer_async`"),
                      ("river", "River `InsertManyFast` (COPY)")):
        got = [r.fills[key].rate for r in results.counted() if key in r.fills]
        if got:
            lines.append(f"| {what} | {statistics.median(got):,.0f} | "
                         + ", ".join(f"{g:,.0f}" for g in got) + " |")
    return lines


def _rounds(results: QueueResults) -> list[str]:
    keys = list(NAMES)
    lines = ["| round | load (1, 5, 15 min) | " + " | ".join(NAMES[k] for k in keys) + " |",
             "|---|---|" + "---:|" * len(keys)]
    for number, round_ in enumerate(results.rounds, 1):
        label = str(number) if round_.counted else f"{number} (warm-up)"
        cells = [f"{round_.rows[k].rate:,.0f}" if k in round_.rows else "-" for k in keys]
        lines.append(f"| {label} | {round_.load} | " + " | ".join(cells) + " |")
    return lines


def _profile(results: QueueResults) -> list[str]:
    if results.profile is None:
        return []
    return ["", *profile_lines(results.profile)]


def profile_lines(profile: Profile, top: int = 12) -> list[str]:
    """The profile's tables: each process's functions by their own (self) share of the
    GIL-holding samples, with their inclusive share beside."""
    lines = ["### Profile: py-spy during a queue drain (default binding)", "",
             "Share of each process's GIL-holding samples, by the function itself (self) "
             "and with what it calls (inclusive):", ""]
    for process, shares in profile.processes.items():
        samples = profile.samples.get(process, 0)
        lines += [f"**{process}** ({samples:,} samples)", "",
                  "| function | self | inclusive |", "|---|---:|---:|"]
        lines += [f"| `{s.function}` | {s.self_:.0%} | {s.inclusive:.0%} |"
                  for s in sorted(shares, key=lambda s: -s.self_)[:top]]
        lines.append("")
    return lines


#: What each does, beside the figures: (aspect, asynctier's queue, Procrastinate 3).
COMPARISON: tuple[tuple[str, str, str], ...] = (
    ("leasing", "batches (`lease(topic, n)`, one statement, `FOR UPDATE SKIP LOCKED`)",
     "one job per `procrastinate_fetch_job` call, one fetch at a time per worker"),
    ("a batch's outcomes", "acks, nacks and dead items in one transaction",
     "one `procrastinate_finish_job` call per job"),
    ("at least once",
     "a lease per item (30 s by default, extended while it runs); a crashed tailer's or "
     "scheduler's items are leased again when their lease runs out, no sweeper to run",
     "a fetched job is `doing`; a crashed worker's jobs stay `doing` until the application "
     "runs a stalled-job sweep of its own (`JobManager.get_stalled_jobs` + `retry_job`, off "
     "the workers' heartbeats, every 10 s by default); none runs here (nothing crashes)"),
    ("run once", "the run-once guard (Redis) unless `--idempotent`", "no"),
    ("retries", "the binding's ladder or `Retry(after=)`, per item, `--max-attempts`",
     "`RetryStrategy` per task (`max_attempts`, constant / linear / exponential wait, "
     "which exceptions)"),
    ("dead items", "kept with their reason and last error, listable, replayable "
                   "(`queue dead`, `queue replay`)",
     "failed jobs stay `failed` in the jobs table, retried by hand (`procrastinate shell`: "
     "`retry`); the error is only in the worker's log (no error column; "
     "`procrastinate_events` has the status changes)"),
    ("priorities", "-1000..1000 per item, served by the lease index", "`priority` per job"),
    ("delays", "`deliver_after` per item, `nack(delay)`", "`schedule_at` / `schedule_in`"),
    ("rate limits, concurrency", "per binding (Redis token bucket, `--concurrency`)",
     "no rate limit; `lock` / `queueing_lock` serialize jobs sharing a key"),
    ("sharding", "topics spread over several PostgreSQL servers", "one database"),
    ("one item", "get, cancel", "cancel, abort (a running job is asked to stop)"),
)


def _comparison() -> list[str]:
    lines = ["### asynctier's queue and Procrastinate, side by side", "",
             "| | asynctier queue | Procrastinate |", "|---|---|---|"]
    return lines + [f"| {a} | {b} | {c} |" for a, b, c in COMPARISON]


def _method(results: QueueResults) -> list[str]:
    return [
        "### Method",
        "",
        "- Each contender drains a full queue: the items are enqueued first (the fill "
        "rate above, not part of the drain), then its consumers are started. The drain "
        "window opens at the first poll (every 0.1 s) that sees an item done and closes "
        "at the poll that sees all of them done, as for the Kafka drains "
        "(`bench/measure.py`). Done means: for asynctier's queue, acked (the item's row "
        "deleted: `count(*)` of the topic's items); for Procrastinate, `status = "
        "'succeeded'`; for Kafka, the consumer group's committed offsets.",
        "- CPU: user + system seconds in that window, from `/proc`, of asynctier's own "
        "processes (`asynctier run` and its scheduler, tailers and delay-tailers "
        "children) or of Procrastinate's two workers; and of PostgreSQL (the postmaster "
        "and every backend, autovacuum included, *without* the benchmark's own polling "
        "connection), Redis and Kafka. Both asynctier drains and Procrastinate's use "
        "two busy processes (the tailer and the scheduler; two workers).",
        "- Before each drain the queue's tables are `VACUUM (ANALYZE)`d (outside the "
        "window), so that no contender pays for the autovacuum of the one before.",
        "- The rounds alternate their order; each goal is the median of the rounds' "
        "ratios (both sides measured in the same round). The machine is shared: see "
        "the load averages.",
        "- Procrastinate drains fewer jobs than asynctier's queue (see the sizes), as "
        "`bench/run.py` does for Celery: at its rate a drain of as many would take ten "
        "minutes or more per round. Its rate is per job (one fetch and one finish round "
        "trip each), so the size changes it little; a smaller backlog, if anything, "
        "favours it (shorter index scans past fetched jobs).",
        "- PostgreSQL runs with the project's dev settings (`asynctier/dev/postgres.py`: "
        "`autovacuum_naptime=1s`, the rest default, `fsync` and `synchronous_commit` on), "
        "the same for both.",
    ]


def render(results: QueueResults) -> str:
    """The section, from its start marker to its end marker."""
    m = results.machine
    lines = [START, "## Queue drain (issue 25)", "",
             f"Measured {m.when} on {m.cpu} ({m.cores} cores, {m.ram_gib:.1f} GiB), "
             f"Python {m.python}. Repeat with `{results.command}` "
             "(`make bench-queue`; `ARGS=--quick` for small sizes).", ""]
    lines += [f"- {k}: {v}" for k, v in results.settings.items()]
    lines += ["", "The headline is the default binding (the run-once guard on), as in "
                  "the Kafka table above; `--idempotent` beside it.", ""]
    lines += [*_table(results), "", *_goals(results), "", *_fills(results),
              *_pickups(results)]
    lines += ["", "Rounds (items/s):", "", *_rounds(results)]
    if results.errors:
        lines += ["", "Errors:", ""] + [f"- {k}: {v}" for k, v in results.errors.items()]
    lines += _profile(results)
    lines += ["", *_comparison(), "", *_method(results), "", "Final line:", "", "```",
              final_line(results), "```", END]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Put ``section`` in ``path`` in place of the old one (appended when there is
    none); the rest of the file is kept as it is."""
    text = path.read_text() if path.exists() else ""
    found = re.search(re.escape(START) + r".*?" + re.escape(END) + r"\n?", text, re.S)
    if found:
        text = text[:found.start()] + section + text[found.end():]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(text)


def keep_section(old: str, new: str) -> str:
    """``new`` (a whole RESULTS.md written by ``bench/run.py``) with ``old``'s queue
    section, and every section after it (the other benchmarks' own), carried over."""
    at = old.find(START)
    if at < 0 or START in new:
        return new
    return new.rstrip("\n") + "\n\n" + old[at:]


def final_line(results: QueueResults) -> str:
    """The line for scripts."""
    def rate(key: str) -> str:
        row = results.median_row(key)
        return "nan" if row is None else f"{row.rate:.0f}"

    values = {
        "queue_ratio_vs_procrastinate": fmt(results.ratio("queue", "procrastinate"), 1),
        "queue_ratio_vs_kafka": fmt(results.ratio("queue", "kafka"), 2),
        "enqueue_per_s": fmt(results.fill_rate("queue"), 0),
        "queue_per_s": rate("queue"),
        "queue_idempotent_per_s": rate("queue_idempotent"),
        "kafka_per_s": rate("kafka"),
        "procrastinate_per_s": rate("procrastinate"),
        "procrastinate_defer_per_s": fmt(results.fill_rate("procrastinate"), 0),
        "drain_vs_river": fmt(results.ratio("queue", "river"), 2),
        "enqueue_vs_river": fmt(results.fill_rate("queue") / results.fill_rate("river"), 2),
        "pickup_p50_ms": fmt(_pick(results, "asynctier idle", "p50"), 1),
        "pickup_p99_ms": fmt(_pick(results, "asynctier idle", "p99"), 1),
        "pickup_p99_vs_river": fmt(_pick(results, "asynctier loaded", "p99")
                                    / _pick(results, "River loaded", "p99"), 2),
    }
    return " ".join(f"{k}={v.replace('n/a', 'nan')}" for k, v in values.items())

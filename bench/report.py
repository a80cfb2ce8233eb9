"""``bench/RESULTS.md`` and the final line, from one run's measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.scenarios import Latency, Row
from bench.spy import Profile
from bench.stack import Machine

#: "RSS the same for both backlog sizes": at most this growth from the small to the large.
RSS_FLAT = 1.25


#: The latency contenders: key in a latency round, and the Results attribute holding the
#: median round.
LATENCY_KEYS = {"raw": "raw_latency", "guard": "latency", "idempotent": "idempotent_latency"}


@dataclass
class Results:
    """Everything one run measured (a scenario that failed has an entry in ``errors``)."""

    machine: Machine
    command: str
    settings: dict[str, str]
    rows: dict[str, Row] = field(default_factory=dict)
    latency: Latency | None = None
    raw_latency: Latency | None = None  # the raw loop at the same rate: the reference
    #: the same run with the binding ``--idempotent``: what the run-once guard adds
    idempotent_latency: Latency | None = None
    memory: dict[int, Row] = field(default_factory=dict)
    limiter_used: bool | None = None
    profiles: dict[str, Profile] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: every round of the interleaved asynctier scenarios (no-op, limiter, flood); ``rows``
    #: holds, per scenario, the round of the median rate
    rounds: list[dict[str, Row]] = field(default_factory=list)
    #: every round of the latency runs (``raw``, ``guard``, ``idempotent``); ``latency``,
    #: ``raw_latency`` and ``idempotent_latency`` hold each one's round of the median p99
    latency_rounds: list[dict[str, Latency]] = field(default_factory=list)
    #: every round of asynctier beside the Kafka-native peers, keyed ``<contender>.<work>``
    #: (``asynctier.noop``, ``quix.sleep``, ``faust.asleep``, ...); ``rows`` holds each
    #: one's round of the median rate
    peer_rounds: list[dict[str, Row]] = field(default_factory=list)

    def keep_median_rows(self) -> None:
        """Put each repeated scenario's median-rate round in ``rows``."""
        for key in {k for r in self.rounds for k in r}:
            runs = sorted((r[key] for r in self.rounds if key in r), key=lambda row: row.rate)
            self.rows[key] = runs[(len(runs) - 1) // 2]

    def keep_median_peer_rows(self) -> None:
        """Put each peer-round contender's median-rate round in ``rows``."""
        for key in {k for r in self.peer_rounds for k in r}:
            runs = sorted((r[key] for r in self.peer_rounds if key in r),
                          key=lambda row: row.rate)
            self.rows[key] = runs[(len(runs) - 1) // 2]

    def peer_ratio(self, work: str, peer: str) -> float | None:
        """asynctier's rate over ``peer``'s with the same ``work``, the median of the peer
        rounds' ratios (both drained in the same round)."""
        mine, theirs = f"asynctier.{work}", f"{peer}.{work}"
        pairs = [r[mine].rate / r[theirs].rate for r in self.peer_rounds
                 if mine in r and theirs in r and r[mine].rate > 0 and r[theirs].rate > 0]
        return sorted(pairs)[(len(pairs) - 1) // 2] if pairs else None

    def better_peer_ratio(self, work: str) -> float | None:
        """asynctier against the faster of the two peers with ``work`` (the lower ratio)."""
        got = [r for r in (self.peer_ratio(work, "quix"), self.peer_ratio(work, "faust"))
               if r is not None]
        return min(got) if got else None

    def p99_ratio(self, key: str) -> float | None:
        """``key``'s p99 over the raw loop's p99 in the same latency round, the median of
        the rounds' ratios."""
        pairs = [r[key].percentile(99) / r["raw"].percentile(99) for r in self.latency_rounds
                 if key in r and "raw" in r and r[key].samples and r["raw"].samples
                 and r["raw"].percentile(99) > 0]
        return sorted(pairs)[(len(pairs) - 1) // 2] if pairs else None

    def keep_median_latency(self) -> None:
        """Put each latency contender's round of the median p99 in ``latency``,
        ``raw_latency`` and ``idempotent_latency`` (one p99 is a few seconds of one run: a
        single spell of the machine sets it, so the runs are repeated)."""
        for key, attr in LATENCY_KEYS.items():
            runs = sorted((r[key] for r in self.latency_rounds
                           if key in r and r[key].samples), key=lambda lat: lat.percentile(99))
            if runs:
                setattr(self, attr, runs[(len(runs) - 1) // 2])

    def rate(self, key: str) -> float | None:
        """Items/s of row ``key`` (None when it was not measured)."""
        row = self.rows.get(key)
        return row.rate if row is not None and row.rate > 0 else None

    def ratio(self, key: str, over: str) -> float | None:
        """rate(key) / rate(over); for scenarios measured in rounds, the median of the
        rounds' ratios (each round runs both back to back, so a slow spell of the machine
        weighs on both sides of a ratio, not on one)."""
        pairs = [r[key].rate / r[over].rate for r in self.rounds
                 if key in r and over in r and r[key].rate > 0 and r[over].rate > 0]
        if pairs:
            return sorted(pairs)[(len(pairs) - 1) // 2]
        a, b = self.rate(key), self.rate(over)
        return a / b if a is not None and b is not None else None

    @staticmethod
    def p99(lat: Latency | None) -> float | None:
        """The p99 (ms) of a latency run, None when it did not run or came back empty."""
        if lat is None or not lat.samples:
            return None
        return lat.percentile(99)

    def rss_growth(self) -> dict[str, float]:
        """Peak RSS at the largest backlog / at the smallest, per process."""
        if len(self.memory) < 2:
            return {}
        small, large = self.memory[min(self.memory)], self.memory[max(self.memory)]
        return {k: large.peak_rss[k] / small.peak_rss[k] for k in small.peak_rss
                if small.peak_rss.get(k) and large.peak_rss.get(k)}

    def headline(self) -> dict[str, float | None]:
        """The numbers of the final line."""
        growth = self.rss_growth()
        return {
            "ratio_vs_raw": self.ratio("asynctier", "raw"),
            "ratio_vs_celery": self.ratio("asynctier", "celery"),
            "ratio_vs_dramatiq": self.ratio("asynctier", "dramatiq"),
            "p99_ms": self.p99(self.latency),
            "raw_p99_ms": self.p99(self.raw_latency),
            "p99_ms_idempotent": self.p99(self.idempotent_latency),
            "flood_ratio": self.ratio("flood", "asynctier"),
            "raw_flood_ratio": self.ratio("raw_flood", "raw"),
            "flood_ratio_idempotent": self.ratio("flood_idempotent", "idempotent"),
            "run_once_cost": self.ratio("asynctier", "idempotent"),
            "limiter_ratio": self.ratio("limiter", "asynctier"),
            "rss_growth": max(growth.values()) if growth else None,
            "ratio_vs_quix": self.peer_ratio("noop", "quix"),
            "ratio_vs_faust": self.peer_ratio("noop", "faust"),
            "io_ratio_vs_quix": self.peer_ratio("sleep", "quix"),
            "io_ratio_vs_faust": self.peer_ratio("sleep", "faust"),
            "aio_ratio_vs_quix": self.peer_ratio("asleep", "quix"),
            "aio_ratio_vs_faust": self.peer_ratio("asleep", "faust"),
            "p99_ratio_vs_raw": self.p99_ratio("guard"),
            "p99_ratio_vs_raw_idempotent": self.p99_ratio("idempotent"),
            "ratio_vs_parallel_consumer": self.peer_ratio("noop", "pc"),
            "io_ratio_vs_parallel_consumer": self.peer_ratio("sleep", "pc"),
        }

    def targets(self) -> dict[str, float | None]:
        """The headline plus the values only the targets use."""
        return {**self.headline(), "io_ratio_vs_best": self.better_peer_ratio("sleep"),
                "aio_ratio_vs_best": self.better_peer_ratio("asleep")}


#: The targets of issue 7 (and issue 5's limiter): key, text, threshold, at least (or most).
TARGETS: list[tuple[str, str, float, bool]] = [
    ("ratio_vs_raw", "asynctier / raw loop", 0.30, True),
    ("ratio_vs_celery", "asynctier / Celery", 40.0, True),
    ("ratio_vs_dramatiq", "asynctier / Dramatiq", 10.0, True),
    ("p99_ratio_vs_raw", "p99 record-to-start at half load / the raw loop's p99, same "
     "round (issue 30)", 1.25, False),
    ("p99_ratio_vs_raw_idempotent", "the same, the binding bound --idempotent", 1.1, False),
    ("ratio_vs_quix", "asynctier / Quix Streams, no-op (issue 30)", 1.0, True),
    ("ratio_vs_faust", "asynctier / faust-streaming, no-op", 5.0, True),
    ("io_ratio_vs_best", "asynctier / the faster peer, 1 ms sync function", 10.0, True),
    ("aio_ratio_vs_best", "asynctier / the faster peer, 1 ms async function", 20.0, True),
    ("flood_ratio", "main-topic drain at 100% failures / success run", 0.8, True),
    ("limiter_ratio", "never-binding rate limiter / no limiter (issue 5)", 0.9, True),
    ("rss_growth", f"peak RSS, largest / smallest backlog (flat: <= {RSS_FLAT})", RSS_FLAT,
     False),
]


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def final_line(results: Results) -> str:
    """``ratio_vs_raw=0.34 ratio_vs_celery=52.0 ...`` (``nan`` when not measured)."""
    parts = []
    for key, value in results.headline().items():
        if value is None:
            parts.append(f"{key}=nan")
        elif key in ("p99_ms", "raw_p99_ms", "p99_ms_idempotent", "ratio_vs_celery",
                     "ratio_vs_dramatiq"):
            parts.append(f"{key}={value:.1f}")
        else:
            parts.append(f"{key}={value:.2f}")
    return " ".join(parts)


def missed(results: Results) -> list[str]:
    """The targets that were measured and missed."""
    out = []
    values = results.targets()
    for key, _, threshold, at_least in TARGETS:
        value = values[key]
        if value is None:
            continue
        if (value < threshold) if at_least else (value > threshold):
            out.append(key)
    return out


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def _rss(row: Row) -> str:
    return " / ".join(f"{k} {_mb(v)}" for k, v in row.peak_rss.items())


#: The contenders of the peer rounds, as ``<contender>.<work>`` keys, in table order.
PEER_KEYS = tuple(f"{c}.{w}" for w in ("noop", "sleep", "asleep")
                  for c in ("asynctier", "quix", "faust", "pc"))
ORDER = ("raw", "raw_flood", "client", "asynctier", "limiter", "flood", "idempotent",
         "flood_idempotent", *PEER_KEYS, "celery", "dramatiq")


def _same_work(results: Results, key: str) -> str:
    """asynctier over this contender with the same work (peer rounds only)."""
    contender, _, work = key.partition(".")
    if contender in ("quix", "faust", "pc"):
        return _num(results.peer_ratio(work, contender))
    return "1.00" if contender == "asynctier" and work else ""


def _throughput_table(results: Results) -> list[str]:
    lines = ["| contender | records | seconds | records/s | x raw loop | x Celery | x Dramatiq "
             "| asynctier / this, same work | CPU-s / 1k records (its processes) "
             "| CPU-s / 1k (Kafka + Redis) | cores busy | peak RSS (MB) |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for key in ORDER:
        row = results.rows.get(key)
        if row is None:
            continue
        lines.append(
            f"| {row.name} | {row.items:,} | {row.seconds:.2f} | {row.rate:,.0f} "
            f"| {_num(results.ratio(key, 'raw'))} | {_num(results.ratio(key, 'celery'), 1)} "
            f"| {_num(results.ratio(key, 'dramatiq'), 1)} | {_same_work(results, key)} "
            f"| {row.cpu_per_1k:.3f} "
            f"| {_num(row.broker_cpu_per_1k, 3)} | {_percent(row.cores_busy)} "
            f"| {_rss(row)} |")
    return lines


def _cpu_split(results: Results) -> list[str]:
    rows = [r for r in results.rows.values() if r.detail]
    if not rows:
        return []
    names = sorted({k for r in rows for k in r.detail})
    lines = ["CPU seconds of each asynctier process in the window:", "",
             "| run | " + " | ".join(n.removeprefix("cpu_s.") for n in names) + " |",
             "|---|" + "--:|" * len(names)]
    lines += [f"| {r.name} | " + " | ".join(f"{r.detail.get(n, 0.0):.2f}" for n in names)
              + " |" for r in rows]
    return [*lines, ""]


def _rounds_table(results: Results) -> list[str]:
    if len(results.rounds) < 2:
        return []
    lines = ["## Rounds", "",
             f"The raw loop and the asynctier scenarios ran in {len(results.rounds)} "
             "interleaved rounds (raw loop, raw flood, no-op, limiter, flood, the "
             "--idempotent no-op and flood, then the same in reverse order, and so on). The "
             "throughput table shows each "
             "scenario's median round; the ratios take the median of the rounds' ratios.",
             "",
             "| round | raw loop records/s | raw flood records/s | raw flood / raw "
             "| no-op records/s | limiter records/s | flood records/s "
             "| limiter / no-op | flood / no-op | no-op --idempotent | flood --idempotent "
             "| flood / no-op, --idempotent | guarded no-op / --idempotent |",
             "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for i, r in enumerate(results.rounds, 1):
        def rate(key: str, r: dict[str, Row] = r) -> str:
            return f"{r[key].rate:,.0f}" if key in r else "n/a"

        def share(key: str, over: str = "asynctier", r: dict[str, Row] = r) -> str:
            if key in r and over in r and r[over].rate > 0:
                return f"{r[key].rate / r[over].rate:.2f}"
            return "n/a"

        lines.append(f"| {i} | {rate('raw')} | {rate('raw_flood')} "
                     f"| {share('raw_flood', 'raw')} "
                     f"| {rate('asynctier')} | {rate('limiter')} | {rate('flood')} "
                     f"| {share('limiter')} | {share('flood')} | {rate('idempotent')} "
                     f"| {rate('flood_idempotent')} "
                     f"| {share('flood_idempotent', 'idempotent')} "
                     f"| {share('asynctier', 'idempotent')} |")
    return [*lines, ""]


def _peer_rounds_table(results: Results) -> list[str]:
    if not results.peer_rounds:
        return []
    keys = [k for k in PEER_KEYS if any(k in r for r in results.peer_rounds)]
    lines = ["## Rounds beside the Kafka-native peers", "",
             f"{len(results.peer_rounds)} round(s), each contender in turn (asynctier, "
             "Quix Streams, faust-streaming; the no-op, then the 1 ms sync, then the 1 ms "
             "async function), every other round in reverse order. Records/s of each; the "
             "ratios of the final line are the medians of the rounds' asynctier / peer.", "",
             "| round | " + " | ".join(f"`{k}`" for k in keys) + " |",
             "|--:|" + "--:|" * len(keys)]
    for i, r in enumerate(results.peer_rounds, 1):
        lines.append(f"| {i} | " + " | ".join(
            f"{r[k].rate:,.0f}" if k in r else "n/a" for k in keys) + " |")
    return [*lines, ""]


def _targets_table(results: Results) -> list[str]:
    lines = ["| target | wanted | measured | met |", "|---|--:|--:|---|"]
    head = results.targets()
    miss = missed(results)
    for key, text, threshold, at_least in TARGETS:
        value = head[key]
        met = "n/a" if value is None else ("no" if key in miss else "yes")
        sign = ">=" if at_least else "<="
        lines.append(f"| {text} | {sign} {threshold:g} | {_num(value)} | {met} |")
    return lines


def _latency_lines(results: Results) -> list[str]:
    lat, raw, idempotent = (results.latency, results.raw_latency,
                            results.idempotent_latency)
    assert lat is not None
    rounds = len(results.latency_rounds)
    runs = [("asynctier (record-to-start)", lat)]
    if raw is not None and raw.samples:
        runs.insert(0, ("raw confluent-kafka loop (record-to-receive), the reference", raw))
    if idempotent is not None and idempotent.samples:
        runs.append(("asynctier, bound --idempotent (no run-once guard)", idempotent))
    each = "in each of" if rounds > 1 else "in"
    lines = [
        f"Open-loop producer at {lat.rate:,.0f} records/s for {lat.seconds:g} s {each} "
        f"{rounds} round(s) ({lat.produced:,} records a run). Each round runs the raw loop "
        "(the reference: the same producer, at the same rate, read by the raw loop, in a "
        "run of its own; a batch fills for at most 5 ms), asynctier as bound by default, "
        "and asynctier bound `--idempotent` (no Redis round trip before a batch runs nor "
        "after: what the run-once guard costs in latency), every other round in reverse "
        "order. The table shows each reader's round of the median p99 (the target takes "
        "that p99); the rounds table shows them all. \"producer late\" is the record's "
        "timestamp minus its due time: how far the producer itself fell behind on the "
        "shared cores, already part of the latency.",
        "",
        "| reader | p50 | p90 | p99 | p99.9 | max | producer late, p99 | samples |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
        *(f"| {name} | " + " | ".join(f"{run.percentile(p):.1f} ms"
                                      for p in (50, 90, 99, 99.9, 100))
          + f" | {run.percentile(99, run.producer_late):.1f} ms | {len(run.samples):,} |"
          for name, run in runs),
    ]
    if rounds > 1:
        def cell(r: dict[str, Latency], key: str) -> str:
            run = r.get(key)
            if run is None or not run.samples:
                return "n/a | n/a"
            return f"{run.percentile(50):.1f} | {run.percentile(99):.1f}"

        lines += ["", "| round | raw p50 | raw p99 | asynctier p50 | asynctier p99 "
                  "| --idempotent p50 | --idempotent p99 |", "|--:|--:|--:|--:|--:|--:|--:|"]
        lines += [f"| {i} | {cell(r, 'raw')} | {cell(r, 'guard')} | {cell(r, 'idempotent')} |"
                  for i, r in enumerate(results.latency_rounds, 1)]
    return lines


def _memory_lines(results: Results) -> list[str]:
    lines = ["| backlog | records/s | tailer peak RSS (MB) | scheduler peak RSS (MB) |",
             "|--:|--:|--:|--:|"]
    for n in sorted(results.memory):
        row = results.memory[n]
        lines.append(f"| {n:,} | {row.rate:,.0f} | {_mb(row.peak_rss.get('tailers', 0))} "
                     f"| {_mb(row.peak_rss.get('scheduler', 0))} |")
    growth = results.rss_growth()
    if growth:
        lines += ["", "Growth, largest / smallest backlog: "
                  + ", ".join(f"{k} x{v:.2f}" for k, v in growth.items()) + "."]
    return lines


PROFILE_NOTE = ("Samples of the thread holding the GIL (py-spy `--gil`, 250/s), from the "
                "first commit to lag 0: where each process's Python CPU time goes. "
                "Inclusive: the function is on the stack; self: it is the innermost frame.")


def _profile_lines(profile: Profile) -> list[str]:
    lines: list[str] = []
    for process, shares in profile.processes.items():
        lines += ["", f"**{process}** ({profile.samples.get(process, 0):,} samples)", "",
                  "| function | inclusive | self |", "|---|--:|--:|"]
        lines += [f"| `{s.function}` | {s.inclusive:.0%} | {s.self_:.0%} |" for s in shares]
    return lines


METHOD = """\
How it is measured:

- Every Kafka contender reads the same preloaded topic (4 partitions, records of about
  100 bytes of JSON `{"id", "t0", "pad"}`), each in its own fresh consumer group.
- **raw loop**: one process, `consume(1000)`, `json.loads` + a no-op call per record,
  a synchronous `commit()` per batch. **client only**: `consume(1000)` and nothing else.
  Both time themselves from the first batch received to the last batch done, and read
  their own CPU time over that window.
- **asynctier**: `asynctier bind` the no-op `bench.noop:noop`, then the default
  `asynctier run` (scheduler, tailers, delay tailers as three processes). The window opens
  at the first poll (every 50 ms) that sees a committed offset of the binding's group and
  closes when the committed offsets reach the end offsets (lag 0); records/s is the
  records committed inside that window over its length. CPU is the sum over the four
  processes (`asynctier run` and its three children) over that window.
- **Celery / Dramatiq**: a feeder reads the first records of the same topic and enqueues
  one task per record *before* the workers start (not measured). Then the workers start;
  the window opens when the first task is acknowledged and closes when the broker holds
  none (Celery: the queue list plus the `unacked` hash; Dramatiq: the queue's `.msgs`
  hash). The task decodes the JSON and calls the same no-op. CPU is the worker process
  tree (main process and its 2 children).
- **latency**: a fresh topic and binding of `bench.noop:timed`; after a warm-up, a
  producer sends at half the rate asynctier reached above, on a fixed schedule (open
  loop: `t0` is the time each record was *due*, so a late producer adds latency instead of
  hiding it), with librdkafka's default producer settings (`linger.ms` 5). The function
  records `time.time() - t0` when it starts. Beside it, the raw loop reads the same kind
  of open-loop run (its own topic) and records `time.time() - t0` on receipt: what the
  client and broker alone give at that rate on this machine; and the same run with the
  binding bound `--idempotent`: the run-once guard's share of the latency (its Redis round
  trip before a batch runs, and the Redis and scheduler CPU it takes on the shared
  cores). The three run in rounds (`--latency-rounds`, 3 in a full run, every other one in
  reverse order), and each reader's p99 is the median over the rounds: on a machine this
  full, a few seconds of congestion set one run's p99 (single 15 s runs of the same
  binding on one warm stack gave 25 to 150 ms).
- **Kafka-native peers** (issue 30; `bench/kafka_peers.py`, bench/README.md): Quix Streams
  (`Application`, at-least-once, `commit_interval` 0.5 s, no changelog topics, a dataframe
  `.update(fn)`) and faust-streaming (one agent, concurrency 1, `broker_commit_interval`
  0.5 s, memory store, no web server), 2 worker processes each in one consumer group,
  released together; the window opens at the first commit once the group is stable with
  both in it and closes when the group's commits reach the topic's end. Quix drains the
  main topic with the no-op; faust, and both peers with the 1 ms functions, drain a smaller
  topic (`--peer-io-records`); asynctier drains the main topic (no-op) and `--io-records`
  (1 ms functions), bound by default (run-once guard on). They run in rounds
  (`--peer-rounds`), every other one in reverse order; each ratio is the median of the
  rounds' asynctier / peer. Neither peer retries later, dead-letters, rate-limits or
  guards against a second run.
- **retry flood**: the same topic bound to a function that always raises; the main topic
  drains into the 30 s delay topic. Measured like the success run. Beside it, the raw
  loop's own flood (`raw_flood`): the raw loop whose function always raises, each record
  written to a retry topic with one header (origin, due time, error) through a producer
  with asynctier's settings (acks=all, idempotent, lz4), the batch's writes flushed before
  its synchronous commit: what writing every record again costs the client and the
  broker on this machine. `raw_flood_ratio` is its drain over the raw loop's, the median
  of the rounds' ratios; the raw loop runs in the rounds too, so `ratio_vs_raw` is a
  median of rounds' ratios as well.
- **run-once guard**: the no-op and the flood are bound as a user binds by default (not
  `--idempotent`: the scheduler claims every record in Redis before it runs and writes
  its success down after; README, "Run once"), and again bound `--idempotent` (no guard).
  The targets use the default binding; `flood_ratio_idempotent` is the flood against the
  no-op with both bound `--idempotent`, `run_once_cost` the default no-op against the
  `--idempotent` one. Each ratio is the median of the rounds' ratios.
- **warm-up**: before the measured rounds, one no-op and one flood run are made and
  thrown away (`--warmup-rounds`, 1 in a full run): the broker started by the run keeps
  compiling its hot paths for minutes, the flood's produce path first met in the first
  flood run.
- **memory**: the kernel's peak RSS (VmHWM) of the largest tailers process and the largest
  scheduler process (a bare run has one per tier and two) while draining a preloaded
  backlog of each size, each in a fresh platform; the throughput table's RSS column too.
- **cores busy**: the share of all the machine's cores busy in the drain's window
  (`psutil.cpu_times()`: user, nice, system, irq, softirq, steal), whoever used them:
  the contender, the broker, Redis, the bench's own polling. n/a for the loops measured
  inside their own process (raw, client).
- Kafka + Redis CPU is counted when their process ids are known (this run's own stack,
  or a local one found by its port).
- Everything runs on one machine, loopback only, at the same time as nothing else of the
  benchmark; other load on the machine (see the load average) adds noise to every row.
"""


def render(results: Results) -> str:
    """The whole of RESULTS.md."""
    m = results.machine
    out = ["# Benchmark results", "",
           f"- machine: {m.cpu}, {m.cores} cores, {m.ram_gib:.0f} GiB RAM, Python {m.python}",
           f"- date: {m.when}", f"- command: `{results.command}`"]
    out += [f"- {k}: {v}" for k, v in results.settings.items()]
    out += ["", "## Throughput", "", *_throughput_table(results), ""]
    out += _cpu_split(results)
    notes = [f"- {row.name}: {row.note}" for row in results.rows.values() if row.note]
    if notes:
        out += ["Notes:", "", *notes, ""]
    out += ["## Targets", "", *_targets_table(results), ""]
    out += _rounds_table(results)
    out += _peer_rounds_table(results)
    if results.latency is not None:
        out += ["## Latency (record-to-start)", "", *_latency_lines(results), ""]
    if results.memory:
        out += ["## Memory", "", *_memory_lines(results), ""]
    for function, profile in results.profiles.items():
        out += [f"## Profile: py-spy during the `bench.noop:{function}` drain",
                "", PROFILE_NOTE, *_profile_lines(profile), ""]
    if results.errors:
        out += ["## Scenarios that failed", ""]
        out += [f"- {k}: {v.splitlines()[0] if v else ''}" for k, v in results.errors.items()]
        out += [""]
    out += ["## Method", "", METHOD, "## Final line", "", "```", final_line(results), "```", ""]
    return "\n".join(out)

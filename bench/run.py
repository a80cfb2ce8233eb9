"""``make bench`` / ``python bench/run.py [--quick]``: the benchmarks of issue 7, in one run.

Preloads the records, measures the client-only reference, then in rounds the raw loop,
the raw loop's retry flood and asynctier (no-op, never-binding rate limit, retry flood;
the no-op and the flood again bound ``--idempotent``, without the run-once guard), then
asynctier's latency at half load, memory at two backlogs and the peers (Celery,
Dramatiq), then writes ``bench/RESULTS.md`` (not in ``--quick``,
unless ``--out`` says where) and prints the final line::

    ratio_vs_raw=0.34 ratio_vs_celery=52.0 ratio_vs_dramatiq=12.4 p99_ms=12.0 flood_ratio=0.90 ...

Kafka and Redis: the run starts its own (free loopback ports, a temporary folder) unless
``ASYNCTIER_KAFKA_BOOTSTRAP`` and ``ASYNCTIER_REDIS_URL`` are set. Every scenario has a
deadline; the run stops by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run as a script: import `bench.*` from the repository, and keep bench/ itself off the
# path so that none of its modules can shadow a standard one.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402

from bench import asynctier_run, queue_report, report, scenarios, spy  # noqa: E402
from bench.measure import python_speed  # noqa: E402
from bench.records import preload  # noqa: E402
from bench.report import Results  # noqa: E402
from bench.stack import Services, machine, services  # noqa: E402

SCENARIOS = ("raw", "raw_flood", "client", "asynctier", "limiter", "flood", "idempotent",
             "flood_idempotent", "latency", "quix", "faust", "pc", "io", "celery", "dramatiq",
             "memory", "profile")
#: The scenarios run in interleaved rounds.
ROUND_KEYS = ("raw", "raw_flood", "asynctier", "limiter", "flood", "idempotent",
              "flood_idempotent")


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line; ``--quick`` changes the defaults of the sizes."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes: about a minute")
    p.add_argument("--records", type=int, help="records in the main topic [200000; quick 20000]")
    p.add_argument("--peer-records", type=int,
                   help="tasks each peer drains [20000; quick 2000]")
    p.add_argument("--latency-seconds", type=float, help="open-loop run length [15; quick 5]")
    p.add_argument("--latency-rate", type=float, default=None,
                   help="the latency runs' producer rate (records/s) [half the measured "
                        "no-op drain rate]: to repeat them alone (`--only latency`)")
    p.add_argument("--latency-rounds", type=int, default=None,
                   help="rounds of the three latency runs (raw loop, asynctier, asynctier "
                        "--idempotent), every other one in reverse order; each p99 is the "
                        "median over the rounds [3; quick 1]")
    p.add_argument("--peer-rounds", type=int, default=None,
                   help="rounds of the Kafka-native peers (Quix Streams, faust-streaming, "
                        "Parallel Consumer) "
                        "beside asynctier, each kind of work in turn, every other round in "
                        "reverse order; their ratios are medians over the rounds [3; quick 1]")
    p.add_argument("--io-records", type=int,
                   help="records asynctier drains with the 1 ms functions [50000; quick "
                        "5000]")
    p.add_argument("--peer-io-records", type=int,
                   help="records Quix and faust drain with the 1 ms functions (faust's "
                        "no-op: --io-records when io runs) [5000; quick 2000]")
    p.add_argument("--backlogs", help="memory backlogs, comma separated "
                                      "[10000,500000; quick 5000,50000]")
    p.add_argument("--limit-rate", type=float, default=1_000_000,
                   help="the never-binding rate limit (items/s) [1000000, the largest a "
                        "binding accepts]")
    p.add_argument("--only", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                   help="py-spy the tailer and scheduler (auto: when a target is missed, "
                        "not in --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds of the no-op, limiter and flood runs (and "
                        "their --idempotent twins), every other one in reverse order; "
                        "their ratios are medians over the rounds [7; quick 1]")
    p.add_argument("--warmup-rounds", type=int, default=None,
                   help="discarded rounds of the no-op and flood runs before the measured "
                        "ones, so that the broker's JIT has compiled both paths [1; quick 0]")
    p.add_argument("--run-args", default="",
                   help="extra options of every `asynctier run` (for example "
                        "\"--max-in-flight 2\"), to compare a setting against the default")
    p.add_argument("--out", type=Path, help="results file [bench/RESULTS.md; quick: none]")
    args = p.parse_args(argv)
    quick = args.quick
    args.records = args.records or (20_000 if quick else 200_000)
    args.peer_records = min(args.peer_records or (2_000 if quick else 20_000), args.records)
    args.rounds = max(1, args.rounds or (1 if quick else 7))
    if args.warmup_rounds is None:
        args.warmup_rounds = 0 if quick else 1
    args.peer_rounds = max(1, args.peer_rounds or (1 if quick else 3))
    args.io_records = args.io_records or (5_000 if quick else 50_000)
    args.peer_io_records = args.peer_io_records or (2_000 if quick else 5_000)
    args.latency_seconds = args.latency_seconds or (5.0 if quick else 15.0)
    args.latency_rounds = max(1, args.latency_rounds or (1 if quick else 3))
    backlogs = args.backlogs or ("5000,50000" if quick else "10000,500000")
    args.backlogs = [int(x) for x in backlogs.split(",") if x.strip()]
    args.only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    args.run_args = shlex.split(args.run_args)
    if args.out is None and not quick:
        args.out = REPO / "bench" / "RESULTS.md"
    return args


class Runner:
    """Runs the scenarios in order; a failed scenario is reported, the others go on."""

    def __init__(self, args: argparse.Namespace, svc: Services, folder: Path,
                 results: Results) -> None:
        self.args = args
        self.svc = svc
        self.folder = folder
        self.results = results
        self.topic = f"bench-main-{uuid.uuid4().hex[:6]}"

    def step(self, name: str, fn: Callable[[], None]) -> None:
        """Run one scenario (when selected), timing it and keeping its error."""
        if name in self.args.only:
            self.attempt(name, fn)

    def attempt(self, name: str, fn: Callable[[], None]) -> None:
        """Run one scenario, timing it and keeping its error."""
        print(f"== {name}", flush=True)
        started = time.monotonic()
        try:
            fn()
        except Exception as exc:  # a scenario's failure is a result too
            self.results.errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"   FAILED: {exc}", flush=True)
            with open(self.folder / "errors.log", "a") as log:
                traceback.print_exc(file=log)
        print(f"   ({time.monotonic() - started:.1f} s)", flush=True)

    def row(self, key: str, row: scenarios.Row) -> None:
        """Keep a row (in the current round too) and print it."""
        self.results.rows[key] = row
        if key in ROUND_KEYS and self.results.rounds:
            self.results.rounds[-1][key] = row
        print(f"   {row.name}: {row.items:,} in {row.seconds:.2f} s = {row.rate:,.0f}/s, "
              f"{row.cpu_per_1k:.3f} CPU-s/1k" + (f"; {row.note}" if row.note else ""),
              flush=True)

    def all(self) -> None:
        """Every selected scenario, in order."""
        a, s, f, n = self.args, self.svc, self.folder, self.args.records
        seconds = preload(s.kafka_bootstrap, self.topic, n)
        print(f"preloaded {n:,} records into {self.topic} in {seconds:.1f} s", flush=True)
        self.step("client", lambda: self.row(
            "client", scenarios.kafka_loop(s, self.topic, n, "client")))
        self._warm_up()
        for round_ in range(a.rounds):
            if a.rounds > 1:
                print(f"-- round {round_ + 1} of {a.rounds}", flush=True)
            self.results.rounds.append({})
            steps: list[tuple[str, Callable[[], None]]] = [
                ("raw", lambda: self.row(
                    "raw", scenarios.kafka_loop(s, self.topic, n, "raw"))),
                ("raw_flood", lambda: self.row(
                    "raw_flood", scenarios.kafka_loop(s, self.topic, n, "raw_flood"))),
                ("asynctier", lambda: self.row(
                    "asynctier", scenarios.asynctier_noop(s, f, self.topic, n))),
                ("limiter", self._limiter),
                ("flood", lambda: self.row(
                    "flood", scenarios.asynctier_flood(s, f, self.topic, n))),
                ("idempotent", lambda: self.row(
                    "idempotent", scenarios.asynctier_noop(s, f, self.topic, n, True))),
                ("flood_idempotent", lambda: self.row(
                    "flood_idempotent",
                    scenarios.asynctier_flood(s, f, self.topic, n, True)))]
            # Every other round runs them in reverse: the machine drifts during a run
            # (the broker's JIT warms up; the no-op drain went from 82k/s to 118k/s over
            # one run), and a fixed order would hand that drift to one side of a ratio.
            for name, fn in steps if round_ % 2 == 0 else reversed(steps):
                self.step(name, fn)
        self.results.keep_median_rows()
        self.step("latency", self._latency)
        if {"quix", "faust", "io"} & a.only:
            self._kafka_peers()
        values: list[bytes] = []
        if {"celery", "dramatiq"} & a.only:
            values = scenarios.peer_values(s, self.topic, a.peer_records)
        self.step("celery", lambda: self.row("celery", scenarios.celery(s, f, values)))
        self.step("dramatiq", lambda: self.row("dramatiq", scenarios.dramatiq(s, f, values)))
        self.step("memory", self._memory)
        if self._want_profile():
            self.step("profile", self._profile)

    def _warm_up(self) -> None:
        """Discarded no-op and flood runs: a broker started by the run compiles its hot
        paths for minutes (the flood's produce path among them), and the first measured
        rounds would carry that compiling as noise (bench/README.md)."""
        s, f, n = self.svc, self.folder, self.args.records
        runs = [(name, fn) for name, fn in (("asynctier", scenarios.asynctier_noop),
                                            ("flood", scenarios.asynctier_flood))
                if name in self.args.only]
        for round_ in range(self.args.warmup_rounds if runs else 0):
            print(f"-- warm-up round {round_ + 1} of {self.args.warmup_rounds} (not counted)",
                  flush=True)
            for name, fn in runs:
                try:
                    print(f"   {name}: {fn(s, f, self.topic, n).rate:,.0f}/s", flush=True)
                except Exception as exc:  # the measured run will say what is wrong
                    print(f"   {name}: warm-up failed: {exc}", flush=True)

    def _kafka_peers(self) -> None:
        """Rounds of asynctier beside Quix Streams and faust-streaming, each kind of work
        in turn; every contender of a round drains a topic of its own size (faust and the
        1 ms peers are slow: a drain of a few seconds each)."""
        a, s, f = self.args, self.svc, self.folder
        io_topic, small_topic = f"{self.topic}-io", f"{self.topic}-peer"
        if "io" in a.only:
            preload(s.kafka_bootstrap, io_topic, a.io_records)
        preload(s.kafka_bootstrap, small_topic, a.peer_io_records)
        steps: list[tuple[str, Callable[[], scenarios.Row]]] = []
        if {"quix", "faust", "pc"} & a.only:
            steps.append(("asynctier.noop", lambda: scenarios.asynctier_work(
                s, f, self.topic, a.records, "noop")))
        if "quix" in a.only:
            steps.append(("quix.noop", lambda: scenarios.kafka_peer(
                s, f, "quix", self.topic, a.records, "noop")))
        if "faust" in a.only:  # 5,000 no-ops drain before its group is seen stable
            faust_topic, faust_n = ((io_topic, a.io_records) if "io" in a.only
                                    else (small_topic, a.peer_io_records))
            steps.append(("faust.noop", lambda: scenarios.kafka_peer(
                s, f, "faust", faust_topic, faust_n, "noop")))
        if "pc" in a.only:
            steps.append(("pc.noop", lambda: scenarios.kafka_peer(
                s, f, "pc", self.topic, a.records, "noop")))
        for work in ("sleep", "asleep") if "io" in a.only else ():
            steps.append((f"asynctier.{work}", lambda w=work: scenarios.asynctier_work(
                s, f, io_topic, a.io_records, w)))
            steps += [(f"{kind}.{work}", lambda k=kind, w=work: scenarios.kafka_peer(
                s, f, k, small_topic, a.peer_io_records, w))
                for kind in ("quix", "faust") if kind in a.only]
            if "pc" in a.only and work == "sleep":  # the JVM: no async form
                # 128 records at once drain 50,000 before its group is seen stable
                steps.append(("pc.sleep", lambda: scenarios.kafka_peer(
                    s, f, "pc", self.topic, a.records, "sleep")))
        for round_ in range(a.peer_rounds):
            print(f"-- peers round {round_ + 1} of {a.peer_rounds}", flush=True)
            measured: dict[str, scenarios.Row] = {}
            self.results.peer_rounds.append(measured)
            for key, fn in steps if round_ % 2 == 0 else reversed(steps):
                def one(key: str = key, fn: Callable[[], scenarios.Row] = fn,
                        measured: dict[str, scenarios.Row] = measured) -> None:
                    measured[key] = fn()
                    self.row(key, measured[key])
                self.attempt(key, one)
        self.results.keep_median_peer_rows()

    def _limiter(self) -> None:
        row, used = scenarios.asynctier_limited(self.svc, self.folder, self.topic,
                                                self.args.records, self.args.limit_rate)
        self.results.limiter_used = used
        self.row("limiter", row)

    def _latency(self) -> None:
        top = self.results.rate("asynctier")
        if self.args.latency_rate is not None:
            top = 2 * self.args.latency_rate
        if top is None:
            raise RuntimeError("no asynctier throughput to take half of (run the asynctier "
                               "scenario too, or give --latency-rate)")
        s, f, seconds = self.svc, self.folder, self.args.latency_seconds
        steps: list[tuple[str, Callable[[], scenarios.Latency]]] = [
            ("raw", lambda: scenarios.raw_latency(s, f, top / 2, seconds)),
            ("guard", lambda: scenarios.latency(s, f, top / 2, seconds)),
            ("idempotent", lambda: scenarios.latency(s, f, top / 2, seconds,
                                                     idempotent=True))]
        names = {"raw": "raw loop", "guard": "asynctier", "idempotent": "asynctier --idempotent"}
        rounds = self.args.latency_rounds
        for round_ in range(rounds):
            if rounds > 1:
                print(f"-- latency round {round_ + 1} of {rounds}", flush=True)
            measured: dict[str, scenarios.Latency] = {}
            self.results.latency_rounds.append(measured)
            for key, fn in steps if round_ % 2 == 0 else reversed(steps):
                run = measured[key] = fn()
                print(f"   {names[key]} at {run.rate:,.0f}/s: p50 {run.percentile(50):.1f} "
                      f"ms, p99 {run.percentile(99):.1f} ms ({len(run.samples):,} samples)",
                      flush=True)
        self.results.keep_median_latency()

    def _memory(self) -> None:
        for n in self.args.backlogs:
            row = scenarios.asynctier_memory(self.svc, self.folder, n)
            self.results.memory[n] = row
            print(f"   backlog {n:,}: {row.rate:,.0f}/s, peak RSS "
                  + ", ".join(f"{k} {v / 2**20:.0f} MB" for k, v in row.peak_rss.items()),
                  flush=True)

    def _want_profile(self) -> bool:
        mode = self.args.profile
        if mode == "never" or "profile" not in self.args.only:
            return False
        if mode == "always":
            return True
        return not self.args.quick and bool(report.missed(self.results))

    def _profile(self) -> None:
        functions = ["noop"]
        if self.args.profile == "always" or "flood_ratio" in report.missed(self.results):
            functions.append("fail")
        for function in functions:
            got = spy.profile_drain(self.svc, self.folder, self.topic, self.args.records,
                                    function)
            self.results.profiles[function] = got
            for process, shares in got.processes.items():
                print(f"   {function}, {process}: " + ", ".join(
                    f"{s.function} {s.self_:.0%}"
                    for s in sorted(shares, key=lambda s: -s.self_)[:4]), flush=True)


def _settings(args: argparse.Namespace, svc: Services) -> dict[str, str]:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "records": f"{args.records:,} in the main topic (4 partitions); the peers drain the "
                   f"first {args.peer_records:,} of them",
        "mode": "quick (small sizes)" if args.quick else "full",
        "services": ("Kafka and Redis started by this run" if svc.own else
                     f"Kafka {svc.kafka_bootstrap} and Redis from the environment (shared)"),
        "load average at start (1, 5, 15 min)": load,
        "Python speed at start (a fixed loop, bench.measure.python_speed)":
            f"{python_speed():.1f} M iterations/s",
    }


def main(argv: list[str]) -> int:
    """Run the benchmark; 0 when it ran (missed targets are results, not errors)."""
    args = parse(argv)
    asynctier_run.RUN_ARGS[:] = args.run_args
    command = "python bench/run.py" + ("" if not argv else " " + shlex.join(argv))
    folder = Path(tempfile.mkdtemp(prefix="asynctier-bench-logs-"))
    print(f"logs in {folder}", flush=True)
    started = time.monotonic()
    with services() as svc:
        results = Results(machine(), command, _settings(args, svc))
        Runner(args, svc, folder, results).all()
    results.settings["load average at end (1, 5, 15 min)"] = ", ".join(
        f"{x:.2f}" for x in os.getloadavg())
    results.settings["Python speed at end"] = f"{python_speed():.1f} M iterations/s"
    results.settings["wall time"] = f"{time.monotonic() - started:.0f} s"
    text = report.render(results)
    if args.out is not None:
        old = args.out.read_text() if args.out.exists() else ""
        args.out.write_text(queue_report.keep_section(old, text))
        print(f"wrote {args.out}")
    else:
        print(text)
    print(report.final_line(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

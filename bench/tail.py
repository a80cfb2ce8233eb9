"""Where the latency tail comes from: the ``latency`` scenario, with every thread on the
machine watched while it runs.

    python -m bench.tail [--rounds 3] [--rate 35000] [--seconds 15] [--aof both|on|off]

Each round runs the raw loop's latency reference and asynctier's ``latency`` scenario (in
alternating order) at ``--rate`` for ``--seconds``, after one discarded warm-up run. Per
run it prints p50/p90/p99/max of record-to-start, how many 100 ms windows of producer time
hold the tail (samples at or above the run's p99: a few windows means a stall, many means
a slow pipeline), and for the worst of those windows the threads that used the most CPU
above their own average for the run (``/proc``, sampled every 50 ms by a process of its
own, which takes about a tenth of a core). Redis' AOF rewrites
during the run are counted (each forks a ``redis-server`` child that writes the whole
data set out). ``--aof both`` alternates asynctier runs with Redis' append-only file on and
off (``CONFIG SET appendonly``) and prints the medians of each.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench import scenarios
from bench.stack import Services, services

WINDOW_S = 0.1
LOOK_BACK_S = 0.3
Thread = tuple[int, str, str]  # pid, process name, thread name


class ThreadSampler:
    """CPU ticks of every thread of every process, every ``period`` seconds (from /proc).

    The sampling runs in a process of its own: a thread here would take the interpreter
    lock from the open-loop producer, which runs in this process, and skew what it
    measures. Walking /proc costs that process about 2 ms of CPU per sample."""

    def __init__(self, period: float = 0.05) -> None:
        context = multiprocessing.get_context("fork")
        self._stop = context.Event()
        self._rows, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_sample, args=(period, self._stop, sender),
                                        daemon=True)
        self._process.start()
        self.rows: list[tuple[float, float, dict[Thread, int]]] = []

    def close(self) -> None:
        self._stop.set()
        self.rows = self._rows.recv()
        self._process.join(10)

    def used(self, start: float, end: float) -> collections.Counter[Thread]:
        """Ticks per thread in the samples overlapping [start, end]."""
        total: collections.Counter[Thread] = collections.Counter()
        for a, b, used in self.rows:
            if b > start and a < end:
                total.update(used)
        return total


def _sample(period: float, stop: Any, rows_to: Any) -> None:
    names: dict[int, str] = {}
    rows: list[tuple[float, float, dict[Thread, int]]] = []
    before, at = _snap(names), time.time()
    while not stop.wait(period):
        now_snap, now = _snap(names), time.time()
        used: dict[Thread, int] = collections.Counter()
        for key, (proc, name, ticks) in now_snap.items():
            was = before.get(key)
            if was is not None and ticks > was[2]:
                used[(key[0], proc, name)] += ticks - was[2]
        rows.append((at, now, dict(used)))
        before, at = now_snap, now
    rows_to.send(rows)


def _snap(names: dict[int, str]) -> dict[tuple[int, int], tuple[str, str, int]]:
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) not in names:
                names[int(pid)] = _process_name(Path(f"/proc/{pid}/cmdline").read_bytes())
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                close = stat.rfind(")")
                fields = stat[close + 2:].split()
                out[(int(pid), int(tid))] = (names[int(pid)], stat[stat.find("(") + 1:close],
                                             int(fields[11]) + int(fields[12]))
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return out


def _process_name(cmdline: bytes) -> str:
    words = [w.decode(errors="replace") for w in cmdline.split(b"\0") if w]
    if "asynctier" in words and "run" in words and words.index("run") + 1 < len(words):
        return f"asynctier {words[words.index('run') + 1]}"  # -m asynctier run <component>
    if any("kafka.Kafka" in w for w in words):
        return "kafka"
    if any("bench.kafka_loops" in w for w in words):
        return "raw loop"
    return Path(words[0]).name if words else "?"


def _rows(lat: scenarios.Latency) -> list[tuple[float, float]]:
    """(t0, ms) of every sample, in producer order."""
    assert lat.file is not None
    rows = [line.split() for line in lat.file.read_text().splitlines()]
    return sorted((float(r[0]), float(r[1])) for r in rows if len(r) == 3)


def report(who: str, lat: scenarios.Latency, sampler: ThreadSampler, run: tuple[float, float],
           rewrites: int) -> None:
    """Print the run's percentiles, its tail windows and what ran hard before the worst."""
    rows = _rows(lat)
    if not rows:
        print(f"{who}: no samples")
        return
    p99 = lat.percentile(99)
    windows: dict[int, list[float]] = collections.defaultdict(list)
    for t0, ms in rows:
        windows[int(t0 / WINDOW_S)].append(ms)
    tail = sorted(((max(v), w) for w, v in windows.items() if max(v) >= p99), reverse=True)
    first = min(windows)
    print(f"{who}: p50 {lat.percentile(50):.1f} p90 {lat.percentile(90):.1f} "
          f"p99 {p99:.1f} max {max(ms for _, ms in rows):.0f} ms; producer late "
          f"p99 {lat.percentile(99, lat.producer_late):.1f} ms; tail in {len(tail)} of "
          f"{len(windows)} windows of {WINDOW_S * 1000:.0f} ms; AOF rewrites {rewrites}",
          flush=True)
    start, end = run
    average = sampler.used(start, end)
    span = max(end - start, 1e-9)
    hz = os.sysconf("SC_CLK_TCK")
    for worst, w in tail[:3]:
        a, b = w * WINDOW_S - LOOK_BACK_S, (w + 1) * WINDOW_S
        used = sampler.used(a, b)
        excess = sorted(((n / (b - a) - average.get(t, 0) / span) / hz, t)
                        for t, n in used.items())[::-1][:5]
        print(f"   at {w * WINDOW_S - first * WINDOW_S:5.1f} s (up to {worst:.0f} ms): "
              + ", ".join(f"{proc}/{name} +{share:.0%}" for share, (_, proc, name) in excess
                          if share > 0.05), flush=True)


def _aof_rewrites(client: redis.Redis) -> int:
    return int(client.info("persistence").get("aof_rewrites", 0))


def _settle(client: redis.Redis) -> None:
    """Wait until no rewrite or save is under way (switching the AOF on starts one)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("rdb_bgsave_in_progress"):
            return
        time.sleep(0.1)


def _measure(svc: Services, folder: Path, who: str, rate: float, seconds: float,
             client: redis.Redis) -> scenarios.Latency:
    sampler = ThreadSampler()
    before, start = _aof_rewrites(client), time.time()
    try:
        if who == "raw loop":
            lat = scenarios.raw_latency(svc, folder, rate, seconds)
        else:
            lat = scenarios.latency(svc, folder, rate, seconds)
    finally:
        end = time.time()
        sampler.close()
    report(who, lat, sampler, (start, end), _aof_rewrites(client) - before)
    return lat


def main(argv: list[str]) -> int:
    """Run the rounds and print what each run's tail was made of."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=35000.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--aof", choices=("both", "on", "off"), default="on",
                   help="Redis' append-only file during asynctier's runs (both: alternate)")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="asynctier-tail-"))
    print(f"logs in {folder}", flush=True)
    p99s: dict[str, list[float]] = collections.defaultdict(list)
    with services() as svc:
        client = redis.Redis.from_url(svc.redis_url)
        scenarios.latency(svc, folder, args.rate, 5.0)  # warm-up, thrown away
        for r in range(args.rounds):
            runs = ["raw loop"] + {"on": ["asynctier"], "off": ["asynctier, AOF off"],
                                   "both": ["asynctier", "asynctier, AOF off"]}[args.aof]
            for who in runs if r % 2 == 0 else runs[::-1]:
                client.config_set("appendonly", "no" if who.endswith("AOF off") else "yes")
                _settle(client)
                lat = _measure(svc, folder, who, args.rate, args.seconds, client)
                p99s[who].append(lat.percentile(99))
        client.config_set("appendonly", "yes")
        _settle(client)  # else Redis, asked to stop, first finishes the rewrite this starts
    print(" ".join(f"{who}: median p99 {statistics.median(v):.1f} ms ({len(v)} runs);"
                   for who, v in p99s.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``--ordering key`` against the unordered no-op binding (issue 32).

    python -m bench.ordering [--records 100000] [--keys 1000] [--rounds 2]

Preloads one topic of ``--records`` keyed records (``--keys`` keys, 4 partitions), then
in interleaved rounds binds the no-op (``bench.noop:noop``) with ``--ordering none`` and
with ``--ordering key`` on a fresh prefix (so a fresh consumer group), runs the default
``asynctier run`` and times the drain from the start until the group's committed offsets
reach the end. Prints a markdown table (with the CPU the tailer and the scheduler took per
1,000 records: what a binding costs, whatever else the machine runs), the ratio of each
round, and ``ordered_ratio=`` (median ordered / median unordered records per second).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition

from bench import spy
from bench.asynctier_run import AsynctierRun
from bench.records import create_topic, record
from bench.stack import services

PARTITIONS = 4


def preload(bootstrap: str, topic: str, n: int, keys: int) -> None:
    """``n`` records over ``keys`` keys, round robin over the partitions by key."""
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "enable.idempotence": True})  # a key's records in order
    for i in range(n):
        while True:
            try:
                producer.produce(topic, record(i, time.time()), b"key-%d" % (i % keys))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The sum of ``group``'s committed offsets on ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=10))
    except Exception:  # a coordinator moving: not yet
        return 0
    finally:
        consumer.close()


def cpu_s(run: AsynctierRun) -> dict[str, float]:
    """CPU seconds (user + system) so far of the run's tailer and scheduler processes."""
    out: dict[str, float] = {}
    for name in ("tailers", "scheduler"):
        try:
            out[name] = sum(sum(p.cpu_times()[:2]) for p in run.component(name)())
        except psutil.Error:
            out[name] = 0.0
    return out


def drain(run: AsynctierRun, bootstrap: str, topic: str, total: int, ordering: str,
          timeout_s: float, profile: Path | None = None) -> tuple[float, dict[str, float]]:
    """Records per second of one drain of ``topic`` bound with ``--ordering``, and the CPU
    seconds its tailer and scheduler took (with ``profile``: py-spy on both, summaries
    printed, raw files there)."""
    run.bind("noop", topic, "noop", "--ordering", ordering)
    started = time.monotonic()
    run.start()
    spies: dict[str, subprocess.Popen[bytes]] = {}
    files: dict[str, Path] = {}
    try:
        while (done := committed(bootstrap, run.group("noop"), topic)) < total:
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"--ordering {ordering}: no drain in {timeout_s:g}s:\n"
                                   f"{run.log_tail()}")
            if profile is not None and done and not spies:
                spies, files = _attach(run, profile)
            run.check()()
            time.sleep(0.2)
        rate = total / (time.monotonic() - started)
        return rate, cpu_s(run)
    finally:
        spy._stop_spies(spies)
        run.stop()
        for target, path in files.items():
            shares, samples = spy.summarize(path.read_text() if path.exists() else "", 25)
            print(f"-- py-spy {run.label} {target}: {samples} samples", flush=True)
            for share in shares:
                print(f"   {share.inclusive:6.1%} {share.self_:6.1%}  {share.function}")


def _attach(run: AsynctierRun, folder: Path) -> tuple[dict[str, subprocess.Popen[bytes]],
                                                      dict[str, Path]]:
    exe = spy.py_spy()
    if exe is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    spies, files = {}, {}
    for target, pid in spy._wait_pids(run).items():
        if target in spy.TARGETS:
            files[target] = folder / f"profile-{run.label}-{target}.txt"
            spies[target] = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
                 "--gil", "--output", str(files[target]), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return spies, files


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="py-spy the tailer and scheduler of each drain (raw files in DIR)")
    args = parser.parse_args()
    with services() as svc, tempfile.TemporaryDirectory(prefix="bench-order-") as tmp:
        topic = f"bench-order-{uuid.uuid4().hex[:6]}"
        preload(svc.kafka_bootstrap, topic, args.records, args.keys)
        rates: dict[str, list[float]] = {"none": [], "key": []}
        cpu: dict[str, list[dict[str, float]]] = {"none": [], "key": []}
        for i in range(args.rounds):
            for ordering in (("none", "key") if i % 2 == 0 else ("key", "none")):
                run = AsynctierRun(svc, Path(tmp), f"{ordering}{i}")
                rate, took = drain(run, svc.kafka_bootstrap, topic, args.records, ordering,
                                   args.timeout, args.profile)
                rates[ordering].append(rate)
                cpu[ordering].append(took)
                print(f"round {i + 1}: --ordering {ordering}: {rate:,.0f} records/s; CPU "
                      + ", ".join(f"{k} {v:.1f}s" for k, v in took.items())
                      + f"; load average {os.getloadavg()[0]:.1f}", flush=True)
    none, key = statistics.median(rates["none"]), statistics.median(rates["key"])
    same = [k / n for k, n in zip(rates["key"], rates["none"], strict=True)]
    per_k = {o: {c: statistics.median(t[c] for t in cpu[o]) * 1000 / (args.records / 1000)
                 for c in ("tailers", "scheduler")} for o in cpu}
    print(f"\n| binding ({args.records:,} records, {args.keys:,} keys, no-op) | "
          "records/s (median) | rounds | x unordered | tailer CPU ms / 1k | "
          "scheduler CPU ms / 1k |\n|---|--:|--|--:|--:|--:|")
    for ordering, median, ratio in (("none", none, 1.0), ("key", key, key / none)):
        print(f"| `--ordering {ordering}` | {median:,.0f} | "
              f"{', '.join(f'{r:,.0f}' for r in rates[ordering])} | {ratio:.2f} | "
              f"{per_k[ordering]['tailers']:.0f} | {per_k[ordering]['scheduler']:.0f} |")
    print(f"\nsame-round ratios: {', '.join(f'{r:.2f}' for r in same)}")
    print(f"ordered_ratio={key / none:.2f}")


if __name__ == "__main__":
    main()

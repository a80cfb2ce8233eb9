"""``--ordering key`` against the unordered no-op binding (issue 32).

    python -m bench.ordering [--records 100000] [--keys 1000] [--rounds 2]

Preloads one topic of ``--records`` keyed records (``--keys`` keys, 4 partitions), then
in interleaved rounds binds the no-op (``bench.noop:noop``) with ``--ordering none`` and
with ``--ordering key`` on a fresh prefix (so a fresh consumer group), runs the default
``asynctier run`` and times the drain from the start until the group's committed offsets
reach the end. Prints a markdown table and ``ordered_ratio=`` (median ordered / median
unordered records per second).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.asynctier_run import AsynctierRun
from bench.records import create_topic, record
from bench.stack import services

PARTITIONS = 4


def preload(bootstrap: str, topic: str, n: int, keys: int) -> None:
    """``n`` records over ``keys`` keys, round robin over the partitions by key."""
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
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


def drain(run: AsynctierRun, bootstrap: str, topic: str, total: int, ordering: str,
          timeout_s: float) -> float:
    """Records per second of one drain of ``topic`` bound with ``--ordering``."""
    run.bind("noop", topic, "noop", "--ordering", ordering)
    started = time.monotonic()
    run.start()
    try:
        while committed(bootstrap, run.group("noop"), topic) < total:
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"--ordering {ordering}: no drain in {timeout_s:g}s:\n"
                                   f"{run.log_tail()}")
            run.check()()
            time.sleep(0.2)
        return total / (time.monotonic() - started)
    finally:
        run.stop()


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    with services() as svc, tempfile.TemporaryDirectory(prefix="bench-order-") as tmp:
        topic = f"bench-order-{uuid.uuid4().hex[:6]}"
        preload(svc.kafka_bootstrap, topic, args.records, args.keys)
        rates: dict[str, list[float]] = {"none": [], "key": []}
        for i in range(args.rounds):
            for ordering in (("none", "key") if i % 2 == 0 else ("key", "none")):
                run = AsynctierRun(svc, Path(tmp), f"{ordering}{i}")
                rate = drain(run, svc.kafka_bootstrap, topic, args.records, ordering,
                             args.timeout)
                rates[ordering].append(rate)
                print(f"round {i + 1}: --ordering {ordering}: {rate:,.0f} records/s",
                      flush=True)
    none, key = statistics.median(rates["none"]), statistics.median(rates["key"])
    print(f"\n| binding ({args.records:,} records, {args.keys:,} keys, no-op) | "
          "records/s (median) | rounds | x unordered |\n|---|--:|--|--:|")
    print(f"| `--ordering none` | {none:,.0f} | "
          f"{', '.join(f'{r:,.0f}' for r in rates['none'])} | 1.00 |")
    print(f"| `--ordering key` | {key:,.0f} | "
          f"{', '.join(f'{r:,.0f}' for r in rates['key'])} | {key / none:.2f} |")
    print(f"\nordered_ratio={key / none:.2f}")


if __name__ == "__main__":
    main()

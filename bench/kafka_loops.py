"""The references: a raw confluent-kafka loop and a client-only loop, one process each.

``raw``: consume 1000 at a time, ``json.loads`` each value, call a no-op, commit the batch
(synchronously) - the least an at-least-once Python consumer does. ``client``: consume
only, nothing else - what the Kafka client alone can deliver to Python.

Run as ``python -m bench.kafka_loops MODE BOOTSTRAP TOPIC GROUP N``; it prints one JSON
line: items, seconds (from the first batch received to the last one done), the process's
CPU seconds in that window and its peak RSS.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
from confluent_kafka import Consumer

from bench.measure import _vm_hwm

BATCH = 1000


def noop(payload: Any) -> None:
    """The function every contender calls per record."""


def _raw_batch(consumer: Consumer, messages: list[Any]) -> int:
    loads = json.loads
    for msg in messages:
        noop(loads(msg.value()))
    consumer.commit(asynchronous=False)
    return len(messages)


def _client_batch(consumer: Consumer, messages: list[Any]) -> int:
    return len(messages)


LOOPS: dict[str, Callable[[Consumer, list[Any]], int]] = {
    "raw": _raw_batch, "client": _client_batch,
}


def _cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def run(mode: str, bootstrap: str, topic: str, group: str, n: int,
        timeout_s: float = 300.0) -> dict[str, float]:
    """Drain ``n`` records of ``topic`` in a fresh group; the measured window."""
    handle = LOOPS[mode]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    done = 0
    started = cpu0 = 0.0
    deadline = time.monotonic() + timeout_s
    while done < n and time.monotonic() < deadline:
        messages = consumer.consume(BATCH, 0.5)
        if not messages:
            continue
        if not started:
            started, cpu0 = time.monotonic(), _cpu()
        done += handle(consumer, [m for m in messages if m.error() is None])
    seconds = time.monotonic() - started
    result = {"items": float(done), "seconds": seconds, "cpu_s": _cpu() - cpu0,
              "peak_rss": float(_vm_hwm(psutil.Process().pid))}
    consumer.close()
    return result


if __name__ == "__main__":
    mode, bootstrap, topic, group, count = sys.argv[1:6]
    print(json.dumps(run(mode, bootstrap, topic, group, int(count))))

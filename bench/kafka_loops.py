"""The references: a raw confluent-kafka loop, its retry flood and a client-only loop, one
process each.

``raw``: consume 1000 at a time, ``json.loads`` each value, call a no-op, commit the batch
(synchronously) - the least an at-least-once Python consumer does. ``raw_flood``: the same
with a function that always fails, each record written to a retry topic
(:class:`RawFlood`). ``client``: consume only, nothing else - what the Kafka client alone
can deliver to Python.

Run as ``python -m bench.kafka_loops MODE BOOTSTRAP TOPIC GROUP N``; it prints one JSON
line: items, seconds (from the first batch received to the last one done), the process's
CPU seconds in that window and its peak RSS.

``latency`` (``python -m bench.kafka_loops latency BOOTSTRAP TOPIC GROUP N FILE``) is the
latency reference: the raw loop reading an open-loop producer's records as they come, and
writing ``now - t0`` in ms (and the producer's lateness, the record's timestamp - ``t0``)
for each of the first ``N`` records not marked ``warmup`` to ``FILE``; a batch fills for
at most :data:`LATENCY_WAIT_S`. It prints ``ready`` once it has read a warm-up record (so
it is assigned and caught up before the measured records are produced).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
from confluent_kafka import Consumer, Producer

from asynctier.platform.kafka import PRODUCER_DEFAULTS
from bench.measure import _vm_hwm
from bench.records import create_topic

BATCH = 1000
#: How long the latency loop lets a batch fill (asynctier's tailer lingers as long): with
#: the throughput loop's wait, a batch of 1000 at 10,000/s would wait 100 ms to fill.
LATENCY_WAIT_S = 0.005


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


def fail(payload: Any) -> None:
    """The function every flood calls per record (the raw flood, and asynctier's through
    ``bench.noop:fail``): it always fails."""
    raise RuntimeError("bench: this function always fails")


class RawFlood:
    """``raw_flood``: the raw loop whose function always fails. Each failed record is
    written to a retry topic with one header saying where it came from, when it is due and
    why it failed (about what asynctier's delay record carries), through a producer with
    asynctier's settings (acks=all, idempotent, lz4); the batch's writes are flushed, then
    the batch is committed: the least an at-least-once consumer with a retry topic does."""

    def __init__(self, bootstrap: str, retry_topic: str) -> None:
        self.retry_topic = retry_topic
        self.failed: list[str] = []  # delivery errors, reported at the next flush
        self.producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap,
                                  "delivery.report.only.error": True,
                                  "on_delivery": self._delivered})

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))

    def __call__(self, consumer: Consumer, messages: list[Any]) -> int:
        loads, produce, topic = json.loads, self.producer.produce, self.retry_topic
        due = str(int(time.time() * 1000) + 30_000)
        for msg in messages:
            try:
                fail(loads(msg.value()))
            except Exception as exc:  # the function always fails: that is the point
                header = (f"attempt=2 due={due} origin={msg.topic()}/{msg.partition()}/"
                          f"{msg.offset()} error={type(exc).__name__}: {exc}").encode()
                produce(topic, msg.value(), msg.key(), headers=[("retry", header)])
        if self.producer.flush(30) != 0 or self.failed:
            raise RuntimeError(f"the raw flood's writes to {topic} were not delivered: "
                               f"{self.failed[:3]}")
        consumer.commit(asynchronous=False)
        return len(messages)


def _loop(mode: str, bootstrap: str, group: str) -> Callable[[Consumer, list[Any]], int]:
    if mode == "raw_flood":
        retry_topic = f"{group}.retry"
        create_topic(bootstrap, retry_topic)
        return RawFlood(bootstrap, retry_topic)
    return {"raw": _raw_batch, "client": _client_batch}[mode]


def _cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def run(mode: str, bootstrap: str, topic: str, group: str, n: int,
        timeout_s: float = 300.0) -> dict[str, float]:
    """Drain ``n`` records of ``topic`` in a fresh group; the measured window."""
    handle = _loop(mode, bootstrap, group)
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


def latency(bootstrap: str, topic: str, group: str, n: int, out: str,
            timeout_s: float = 300.0) -> None:
    """The raw loop's record-to-receive latency (see the module's docstring)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    samples: list[str] = []
    ready = False
    loads, now = json.loads, time.time
    deadline = time.monotonic() + timeout_s
    while len(samples) < n and time.monotonic() < deadline:
        messages = consumer.consume(BATCH, LATENCY_WAIT_S)
        for msg in messages:
            if msg.error() is not None:
                continue
            payload = loads(msg.value() or b"{}")
            noop(payload)
            if payload.get("warmup"):
                if not ready:
                    ready = True
                    print("ready", flush=True)
                continue
            t0 = payload["t0"]
            produced_ms = msg.timestamp()[1] - t0 * 1000.0
            samples.append(f"{t0} {(now() - t0) * 1000.0:.3f} {produced_ms:.3f}")
        if messages:
            consumer.commit(asynchronous=False)
    consumer.close()
    with open(out, "w") as f:
        f.write("\n".join(samples) + "\n")
    print(json.dumps({"items": len(samples)}), flush=True)


if __name__ == "__main__":
    mode, bootstrap, topic, group, count = sys.argv[1:6]
    if mode == "latency":
        latency(bootstrap, topic, group, int(count), sys.argv[6])
    else:
        print(json.dumps(run(mode, bootstrap, topic, group, int(count))))

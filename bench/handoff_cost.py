"""What a retry costs the tailer process: one delay record, against a bare produce.

    python -m bench.handoff_cost [--records 100000] [--rounds 3]

Reads ``--records`` preloaded records back (about 100 bytes each, no key, no headers, as
the retry flood's), then, in each round, writes all of them to a delay topic three ways
with the platform's producer settings, and measures this process's CPU (every thread:
librdkafka's own included) from the first produce to the confirmed delivery of the last:

- **hand-off**: what a tailer does in a retry flood: :meth:`Handoff.resolve_messages`
  (every record a retry) and :meth:`Handoff.confirm`; each record goes to the first delay
  topic with the six headers DESIGN.md gives a delay record (binding, attempt, origin,
  error, first seen, due);
- **bare produce, same headers**: ``Producer.produce`` of the same records with six
  headers of the same sizes built beforehand (the client's share of the hand-off);
- **bare produce, no headers**: the same records without headers (what the client costs
  without the platform's headers).

Prints the median of the rounds per way, in µs of CPU per record, of this process and
(when its process is known: started by the run, or found listening on its port) of the
Kafka broker. The retry flood of ``bench/run.py`` pays the hand-off for every record on
top of what the success run pays. Producer settings can be changed for a comparison with
the ``[kafka]`` table of a config file (``ASYNCTIER_CONFIG``), as for the platform. Kafka
and Redis: ``ASYNCTIER_KAFKA_BOOTSTRAP`` / ``ASYNCTIER_REDIS_URL`` when set,
else started for the run (see :mod:`bench.stack`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil
from confluent_kafka import Consumer

from asynctier.delay_streams.handoff import Handoff
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.kafka import ConfirmingProducer
from asynctier.platform.wire import Outcome, retry
from bench.records import preload
from bench.stack import services

ERROR = "RuntimeError: bench: this function always fails"


def read_back(bootstrap: str, topic: str, n: int, timeout_s: float = 60.0) -> list[Any]:
    """The ``n`` records of ``topic``, as confluent-kafka Messages."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cost-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {len(got):,} of {n:,} records of {topic}")
            got += [m for m in consumer.consume(1000, 1.0) if m.error() is None]
    finally:
        consumer.close()
    return got


def _broker_cpu_s(broker: psutil.Process | None) -> float:
    if broker is None:
        return 0.0
    times = broker.cpu_times()
    return float(times.user + times.system)


def _cpu_us_per_record(n: int, work: Callable[[], None],
                       broker: psutil.Process | None) -> tuple[float, float]:
    """This process's and the broker's CPU µs per record while ``work`` ran."""
    started, broker_started = time.process_time(), _broker_cpu_s(broker)
    work()
    return ((time.process_time() - started) / n * 1e6,
            (_broker_cpu_s(broker) - broker_started) / n * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    n = args.records
    with services() as svc:
        os.environ["ASYNCTIER_KAFKA_BOOTSTRAP"] = svc.kafka_bootstrap
        os.environ["ASYNCTIER_PREFIX"] = f"bench-cost-{uuid.uuid4().hex[:6]}"
        settings = Settings.load(None)
        source = f"{settings.prefix}.src"
        preload(svc.kafka_bootstrap, source, n)
        messages = read_back(svc.kafka_bootstrap, source, n)
        binding = Binding("cost", source, "bench.noop:fail")
        ensure_binding_topics(settings, [binding])
        handoff = Handoff(settings)
        topic = settings.names.delay_topic("30s")
        outcomes: list[Outcome] = [retry(i, ERROR) for i in range(n)]
        origins = [f"{m.topic()}/{m.partition()}/{m.offset()}" for m in messages]
        size = sum(len(m.value() or b"") for m in messages)
        now = str(int(time.time() * 1000)).encode()
        bare = ConfirmingProducer(settings)
        fixed: list[tuple[str, bytes | None]] = [("asynctier.binding", b"cost"),
                                                 ("asynctier.attempt", b"2")]
        tail: list[tuple[str, bytes | None]] = [
            ("asynctier.error", ERROR.encode()), ("asynctier.first-seen", now),
            ("asynctier.due", now)]
        with_headers = [[*fixed, ("asynctier.origin", o.encode()), *tail] for o in origins]

        def hand_off() -> None:
            for at in range(0, n, 1000):
                counts = handoff.resolve_messages(binding, messages[at:at + 1000],
                                                  outcomes[:min(1000, n - at)],
                                                  origins[at:at + 1000], size)
                if counts["retry"] != min(1000, n - at):
                    raise RuntimeError(f"expected every record retried, got {counts}")
            handoff.confirm()

        def produce(headers: bool) -> Callable[[], None]:
            def go() -> None:
                for i, msg in enumerate(messages):
                    if headers:
                        bare.produce(topic, msg.value(), None, with_headers[i])
                    else:
                        bare.produce(topic, msg.value(), None)
                    if i % 1000 == 999:
                        bare.poll(0)
                bare.confirm()
            return go

        ways: dict[str, Callable[[], None]] = {
            "hand-off (resolve_messages + confirm)": hand_off,
            "bare produce, the same six headers": produce(True),
            "bare produce, no headers": produce(False)}
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        broker = psutil.Process(svc.kafka_pid) if svc.kafka_pid else None
        produce(False)()  # warm-up: connections, the topic's metadata
        for _ in range(args.rounds):
            for name, work in ways.items():
                got[name].append(_cpu_us_per_record(n, work, broker))
        bare.close()
        handoff.producer.close()
    for name, rounds in got.items():
        mine, theirs = [r[0] for r in rounds], [r[1] for r in rounds]
        line = (f"{name}: {statistics.median(mine):.2f} us CPU/record in this process "
                f"(rounds: {', '.join(f'{r:.2f}' for r in mine)})")
        if broker is not None:
            line += (f", the broker {statistics.median(theirs):.2f} "
                     f"(rounds: {', '.join(f'{r:.2f}' for r in theirs)})")
        print(f"{line}; {n:,} records each")


if __name__ == "__main__":
    main()

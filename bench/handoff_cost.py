"""What a retry costs the tailer process: one delay record, against a bare produce.

    python -m bench.handoff_cost [--records 100000] [--rounds 3] [--keys]

Reads ``--records`` preloaded records back (about 100 bytes each, no headers, no key as
the retry flood's unless ``--keys``), then, in each round, writes all of them to a delay
topic five ways with the platform's producer settings, and measures this process's CPU
(every thread: librdkafka's own included) from the first produce to the confirmed delivery
of the last. The hand-off writes each batch of 1,000 to one partition (see
:class:`Handoff`); the other ways leave the partition to the client, which spreads records
with keys over every partition by their keys:

- **hand-off**: what a tailer does in a retry flood: :meth:`Handoff.resolve_messages`
  (every record a retry) and :meth:`Handoff.confirm`; each record goes to the first delay
  topic with the packed header docs/design.md gives a delay record (binding, attempt, due,
  origin, first seen, error in one ``asynctier.delay``);
- **bare produce, one packed header**: ``Producer.produce`` of the same records with that
  header built beforehand (the client's share of the hand-off);
- **bare produce, the same six headers**: the same fields as six headers of the same
  sizes (as delay records carried them before they were packed, and dead letters do);
- **bare produce, no headers**: the same records without headers (what the client costs
  without the platform's headers);
- **client produce, six headers by keyword / by position**: the Kafka client's own
  ``produce`` with the same headers passed as ``headers=...``, and by position as the
  hand-off passes them (the client looks each keyword up by name: see
  ``asynctier.platform.kafka.PRODUCE_ANY_PARTITION``).

Prints the median of the rounds per way, in µs of CPU per record, of this process, of the
thread that produces (the calls and the wait for delivery, without librdkafka's threads),
and (when its process is known: started by the run, or found listening on its port) of the
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

from asynctier.delay_streams.handoff import Handoff, pack_delay
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.kafka import PRODUCE_ANY_PARTITION, ConfirmingProducer
from asynctier.platform.names import (
    H_ATTEMPT,
    H_BINDING,
    H_DELAY,
    H_DUE,
    H_ERROR,
    H_FIRST_SEEN,
    H_ORIGIN,
)
from asynctier.platform.wire import Outcome, retry
from bench.measure import Meter, single
from bench.records import preload, read_messages
from bench.stack import services

ERROR = "RuntimeError: bench: this function always fails"


def _cpu_us_per_record(n: int, work: Callable[[], None],
                       broker: Meter) -> tuple[float, float, float]:
    """This process's, this thread's and the broker's CPU µs per record while ``work``
    ran."""
    broker.sample()
    started, thread_started = time.process_time(), time.thread_time()
    broker_started = broker.cpu()["broker"]
    work()
    thread = time.thread_time() - thread_started
    broker.sample()
    return ((time.process_time() - started) / n * 1e6, thread / n * 1e6,
            (broker.cpu()["broker"] - broker_started) / n * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keys", action="store_true",
                   help="records with keys (50,000 customers), as most topics hold")
    args = p.parse_args()
    n = args.records
    with services() as svc:
        os.environ["ASYNCTIER_KAFKA_BOOTSTRAP"] = svc.kafka_bootstrap
        os.environ["ASYNCTIER_PREFIX"] = f"bench-cost-{uuid.uuid4().hex[:6]}"
        settings = Settings.load(None)
        source = f"{settings.prefix}.src"
        preload(svc.kafka_bootstrap, source, n, keyed=args.keys)
        messages = read_messages(svc.kafka_bootstrap, source, n)
        binding = Binding("cost", Source("kafka", source), "bench.noop:fail")
        ensure_binding_topics(settings, [binding])
        handoff = Handoff(settings)
        topic = settings.names.delay_topic("30s")
        outcomes: list[Outcome] = [retry(i, ERROR) for i in range(n)]
        origins = [f"{m.topic()}/{m.partition()}/{m.offset()}" for m in messages]
        now = str(int(time.time() * 1000)).encode()
        bare = ConfirmingProducer(settings)
        fixed: list[tuple[str, bytes | None]] = [(H_BINDING, b"cost"), (H_ATTEMPT, b"2")]
        tail: list[tuple[str, bytes | None]] = [
            (H_ERROR, ERROR.encode()), (H_FIRST_SEEN, now), (H_DUE, now)]
        with_headers = [[*fixed, (H_ORIGIN, o.encode()), *tail] for o in origins]
        packed: list[list[tuple[str, bytes | None]]] = [[(H_DELAY, pack_delay(
            "cost", 2, int(now), o, int(now), ERROR))] for o in origins]

        def hand_off() -> None:
            for at in range(0, n, 1000):
                batch = messages[at:at + 1000]  # as a tailer reads them, with their bytes
                counts = handoff.resolve_messages(binding, batch, outcomes[:len(batch)],
                                                  origins[at:at + 1000],
                                                  sum(len(m.value() or b"") for m in batch))
                if counts["retry"] != len(batch):
                    raise RuntimeError(f"expected every record retried, got {counts}")
            handoff.confirm()

        def each(send: Callable[[int, Any], None]) -> Callable[[], None]:
            """Every record through ``send(i, message)``, polled, then confirmed."""
            def go() -> None:
                for i, msg in enumerate(messages):
                    send(i, msg)
                    if i % 1000 == 999:
                        bare.poll(0)
                bare.confirm()
            return go

        fast = bare.client_produce
        ways: dict[str, Callable[[], None]] = {
            "hand-off (resolve_messages + confirm)": hand_off,
            "bare produce, one packed header": each(
                lambda i, m: bare.produce(topic, m.value(), m.key(), packed[i])),
            "bare produce, the same six headers": each(
                lambda i, m: bare.produce(topic, m.value(), m.key(), with_headers[i])),
            "bare produce, no headers": each(
                lambda i, m: bare.produce(topic, m.value(), m.key())),
            "client produce, six headers by keyword": each(
                lambda i, m: fast(topic, m.value(), m.key(),
                                  headers=with_headers[i])),  # type: ignore[arg-type]
            "client produce, six headers by position": each(
                lambda i, m: fast(topic, m.value(), m.key(), PRODUCE_ANY_PARTITION, None, None,
                                  0, with_headers[i]))}  # type: ignore[arg-type]
        got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
        broker = Meter({"broker": single(svc.kafka_pid)})
        ways["bare produce, no headers"]()  # warm-up: connections, the topic's metadata
        for _ in range(args.rounds):
            for name, work in ways.items():
                got[name].append(_cpu_us_per_record(n, work, broker))
        bare.close()
        handoff.producer.close()
    for name, rounds in got.items():
        mine, thread, theirs = ([r[0] for r in rounds], [r[1] for r in rounds],
                                [r[2] for r in rounds])
        line = (f"{name}: {statistics.median(mine):.2f} us CPU/record in this process "
                f"(rounds: {', '.join(f'{r:.2f}' for r in mine)}), "
                f"{statistics.median(thread):.2f} in the producing thread")
        if svc.kafka_pid is not None:
            line += (f", the broker {statistics.median(theirs):.2f} "
                     f"(rounds: {', '.join(f'{r:.2f}' for r in theirs)})")
        print(f"{line}; {n:,} records each")


if __name__ == "__main__":
    main()

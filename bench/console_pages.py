"""Console page timings at size: N bindings, M dead letters, Q queue items.

    .venv/bin/python -m bench.console_pages [--bindings 100] [--dead-letters 1000000]
        [--queue-items 1000000] [--requests 40]

Starts its own Kafka, Redis and PostgreSQL (the dev-stack code, free ports, a temporary
folder), binds N bindings (their dead-letter and delay topics), writes M dead letters to
the first binding's dead-letter topic and Q ready items to one queue topic, serves the
console with uvicorn and asks each page ``--requests`` times over HTTP (one client, one
request at a time). Prints one markdown table: p50, p95 and the largest, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2
import uvicorn
from confluent_kafka import Producer

from asynctier import dev as devstack
from asynctier.console import ConsoleOptions, create_app
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue import QueueStore
from asynctier.queue.items import NewItem

TOKEN = "bench-console-token-0123456789"


def _fill(settings: Settings, bindings: int, dead: int, items: int, dsn: str) -> None:
    made = [Binding(name=f"b{i:03d}", topic=f"src{i:03d}", function="bench.noop:noop")
            for i in range(bindings)]
    registry = BindingRegistry(settings)
    for binding in made:
        registry.put(binding)
    ensure_binding_topics(settings, made)
    started = time.monotonic()
    producer = Producer(settings.kafka_config(**{"linger.ms": 50, "compression.type": "lz4"}))
    topic = settings.names.dlq_topic("b000")
    for i in range(dead):
        headers = [(n.H_REASON, b"max_attempts"), (n.H_ERROR, f"boom {i}".encode()),
                   (n.H_ATTEMPTS_MADE, b"5"), (n.H_FIRST_SEEN, b"1700000000000")]
        while True:
            try:
                producer.produce(topic, b'{"id": %d}' % i, f"k{i}".encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    print(f"{dead:,} dead letters in {time.monotonic() - started:.1f} s", file=sys.stderr)
    started = time.monotonic()
    store = QueueStore(dsn, pool_size=2)
    store.migrate()
    for first in range(0, items, 1000):
        store.enqueue("bench", [NewItem("jobs", b'{"n": 1}', id=f"i{j}", priority=j % 10)
                                for j in range(first, min(items, first + 1000))])
    store.close()
    print(f"{items:,} queue items in {time.monotonic() - started:.1f} s", file=sys.stderr)


def _serve(settings: Settings,
           bindings: int) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = devstack.free_port()
    app = create_app(settings, ConsoleOptions(listen=f"127.0.0.1:{port}", token=TOKEN,
                                              sample_every_s=5.0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while len(app.state.console.sampler.latest.bindings) < bindings:
        if time.monotonic() > deadline:
            raise SystemExit("the console did not read every binding within 2 minutes")
        time.sleep(0.2)
    return server, thread, f"http://127.0.0.1:{port}"


def pages(dead: int) -> tuple[str, ...]:
    """The pages timed: the overview, a binding, dead letters (first page, last page, a
    filter, one in the middle), the queue (counts, one item, the dead), tenants, replays."""
    return ("/", "/live/overview", "/bindings/b000", "/dlq/b000",
            f"/dlq/b000?start={max(0, dead - 200)}", f"/dlq/b000?error=boom+{dead // 3}",
            f"/dlq/b000/{dead // 2}", "/queue?namespace=bench",
            "/queue/item?namespace=bench&topic=jobs&id=i777", "/queue/bench/jobs/dead",
            "/tenants", "/jobs")


def _time(base: str, requests: int, dead: int) -> list[tuple[str, float, float, float]]:
    rows = []
    with httpx2.Client(base_url=base, headers={"authorization": f"Bearer {TOKEN}"},
                      timeout=30) as client:
        for page in pages(dead):
            took = []
            for _ in range(requests):
                started = time.perf_counter()
                response = client.get(page)
                took.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (page, response.status_code)
            took.sort()
            rows.append((page, statistics.median(took),
                         took[max(0, int(len(took) * 0.95) - 1)], took[-1]))
    return rows


def main(argv: list[str]) -> int:
    """Fill, serve, time, print."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bindings", type=int, default=100)
    p.add_argument("--dead-letters", type=int, default=1_000_000)
    p.add_argument("--queue-items", type=int, default=1_000_000)
    p.add_argument("--requests", type=int, default=40)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        kafka = devstack.start_test_kafka(root / "k")
        redis = devstack.start_test_redis(root / "r")
        postgres = devstack.start_test_postgres(root / "p")
        try:
            settings = Settings(kafka={"bootstrap.servers": kafka.bootstrap},
                                redis_url=redis.url, prefix="bench",
                                queue_shards=(postgres.dsn,))
            _fill(settings, args.bindings, args.dead_letters, args.queue_items, postgres.dsn)
            server, thread, base = _serve(settings, args.bindings)
            try:
                rows = _time(base, args.requests, args.dead_letters)
            finally:
                server.should_exit = True
                thread.join(30)  # the console closes its readers before the broker stops
        finally:
            postgres.stop()
            redis.stop()
            kafka.stop()
    print(f"| page ({args.bindings} bindings, {args.dead_letters:,} dead letters, "
          f"{args.queue_items:,} queue items) | p50 ms | p95 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for page, p50, p95, most in rows:
        print(f"| `{page}` | {p50:.1f} | {p95:.1f} | {most:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

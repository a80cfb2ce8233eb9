"""Console page timings at size: N bindings, M dead letters, Q queue items.

    .venv/bin/python -m bench.console_pages [--bindings 100] [--dead-letters 1000000]
        [--queue-items 1000000] [--requests 40]

Starts its own Kafka, Redis and PostgreSQL (the dev-stack code, free ports, a temporary
folder), binds N bindings (their dead-letter and delay topics), writes M dead letters to
the first binding's dead-letter topic and Q ready items to one queue topic, runs
``asynctier run console`` in a process of its own and asks each page ``--requests`` times
over HTTP (one client, one request at a time). Prints one markdown table (p50, p95 and the
largest, in ms) and the console process's peak RSS (what the Helm chart's console requests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from confluent_kafka import Producer

from asynctier import dev as devstack
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue import QueueStore
from asynctier.queue.items import NewItem

TOKEN = "bench-console-token-0123456789"


def _fill(settings: Settings, bindings: int, dead: int, items: int, dsn: str) -> None:
    made = [Binding(name=f"b{i:03d}", source=Source("kafka", f"src{i:03d}"),
                    function="bench.noop:noop")
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


def _serve(settings: Settings, bindings: int, folder: Path) -> tuple[subprocess.Popen[bytes],
                                                                     str]:
    """``asynctier run console`` in its own process (as a deployment runs it), once its
    overview lists every binding."""
    port = devstack.free_port()
    env = {**os.environ, "ASYNCTIER_CONFIG": str(folder / "none.toml"),
           "ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix,
           "ASYNCTIER_QUEUE_SHARDS": ",".join(settings.queue_shards),
           "ASYNCTIER_CONSOLE_LISTEN": f"127.0.0.1:{port}", "ASYNCTIER_CONSOLE_TOKEN": TOKEN}
    (folder / "none.toml").write_text("")
    log = open(folder / "console.log", "wb")  # noqa: SIM115 - the process owns it
    console = subprocess.Popen([sys.executable, "-m", "asynctier", "run", "console"], env=env,
                               stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    with httpx2.Client(base_url=base, headers={"authorization": f"Bearer {TOKEN}"},
                       timeout=10) as client:
        while True:
            try:
                if client.get("/live/overview").text.count("/bindings/b") >= bindings:
                    return console, base
            except httpx2.TransportError:
                pass
            if console.poll() is not None or time.monotonic() > deadline:
                console.kill()
                raise SystemExit("the console did not list every binding within 2 minutes: "
                                 f"see {folder / 'console.log'}")
            time.sleep(0.5)


def peak_rss_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


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
            console, base = _serve(settings, args.bindings, root)
            try:
                rows = _time(base, args.requests, args.dead_letters)
                peak_mb = peak_rss_mb(console.pid)
            finally:
                console.terminate()  # it closes its readers before the broker stops
                console.wait(30)
        finally:
            postgres.stop()
            redis.stop()
            kafka.stop()
    print(f"| page ({args.bindings} bindings, {args.dead_letters:,} dead letters, "
          f"{args.queue_items:,} queue items) | p50 ms | p95 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for page, p50, p95, most in rows:
        print(f"| `{page}` | {p50:.1f} | {p95:.1f} | {most:.1f} |")
    print(f"\nThe console process's peak RSS: {peak_mb:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

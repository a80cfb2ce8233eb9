"""The queue store's own throughput: batched enqueue, then lease + resolve.

    python -m bench.queue_store [--items 100000] [--enqueue-batch 1000] [--lease-batch 500]
                                [--workers 1]

Enqueues ``--items`` small items (a 40-byte JSON payload, no headers, mixed priorities)
``--enqueue-batch`` per call, then drains them with ``--workers`` threads, each leasing
``--lease-batch`` and acking them in one ``resolve``. Prints items/s of each phase and
the share of time each call took (median ms). PostgreSQL: the first of
``ASYNCTIER_QUEUE_SHARDS`` when set, else a server started for the run (the dev stack's
settings: durable commits, autovacuum every second).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from asynctier.dev.testing import start_test_postgres
from asynctier.queue import NewItem, QueueStore


@contextmanager
def postgres_dsn() -> Iterator[str]:
    """The DSN of the run's PostgreSQL (started and stopped here unless given)."""
    given = os.environ.get("ASYNCTIER_QUEUE_SHARDS")
    if given:
        yield given.split(",")[0].strip()
        return
    root = Path(tempfile.mkdtemp(prefix="asynctier-bench-"))
    node = start_test_postgres(root)
    try:
        yield node.dsn
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(node.data_dir.parent, ignore_errors=True)


def enqueue_all(store: QueueStore, ns: str, items: int, batch: int) -> tuple[float, list[float]]:
    """Seconds to enqueue every item, and each call's seconds."""
    calls = []
    started = time.perf_counter()
    for start in range(0, items, batch):
        chunk = [NewItem("bench", b'{"n": %d, "pad": "0123456789abcdef"}' % n,
                         id=str(n), priority=n % 3)
                 for n in range(start, min(items, start + batch))]
        t = time.perf_counter()
        store.enqueue(ns, chunk)
        calls.append(time.perf_counter() - t)
    return time.perf_counter() - started, calls


def drain_all(store: QueueStore, ns: str, batch: int, workers: int) -> tuple[float, int,
                                                                              list[float]]:
    """Seconds to lease and ack every item, how many, and each lease+resolve's seconds."""
    calls: list[float] = []
    counts = [0] * workers

    def work(n: int) -> None:
        owner = f"bench-{n}"
        while True:
            t = time.perf_counter()
            got = store.lease(ns, "bench", batch, 60, owner)
            if not got:
                return
            store.resolve(ns, "bench", owner, acks=[g.id for g in got])
            calls.append(time.perf_counter() - t)
            counts[n] += len(got)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, sum(counts), calls


def main() -> None:
    """Run both phases and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--enqueue-batch", type=int, default=1000)
    parser.add_argument("--lease-batch", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    with postgres_dsn() as dsn, QueueStore(dsn, pool_size=args.workers + 1) as store:
        store.migrate()
        ns = "b" + uuid.uuid4().hex[:10]
        seconds, calls = enqueue_all(store, ns, args.items, args.enqueue_batch)
        print(f"enqueue: {args.items:,} items in batches of {args.enqueue_batch:,}: "
              f"{seconds:.2f} s, {args.items / seconds:,.0f} items/s "
              f"(median call {statistics.median(calls) * 1000:.1f} ms)")
        seconds, drained, calls = drain_all(store, ns, args.lease_batch, args.workers)
        print(f"lease+resolve: {drained:,} items in batches of {args.lease_batch:,}, "
              f"{args.workers} worker(s): {seconds:.2f} s, {drained / seconds:,.0f} items/s "
              f"(median lease+resolve {statistics.median(calls) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()

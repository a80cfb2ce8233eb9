"""Queue pickup: how long an item enqueued on an idle topic waits before a tailer leases
it, woken by its enqueue's notification against the bounded poll alone; and what the
notification costs an enqueue.

1. Two queue sources (the tailer's own ``QueueSource``), each on its own idle topic and
   leasing in a loop as the tailer does: one woken by LISTEN/NOTIFY, the other with its
   wake-up taken away (the poll alone, as before). ``--items`` single items are enqueued
   to each in turn, at random gaps of 20-200 ms; pickup = the lease's return minus the
   enqueue's commit, both on this process's clock.
2. Enqueue cost: batches of 1 and of 1,000 ready items (notified) against the same items
   ready but not notified (``deliver_after_ms=0``), interleaved, ``--rounds`` each.
3. Many writers: ``--writers`` threads enqueueing single items for ``--seconds``, notified
   against not notified, ``--rounds`` interleaved rounds (PostgreSQL serializes the
   commits of transactions that notify).

    .venv/bin/python -m bench.queue_pickup [--items 300] [--rounds 5] [--writers 8]
                                           [--seconds 5]

The final line reads ``pickup_p50_ms=.. pickup_p99_ms=.. poll_p50_ms=.. poll_p99_ms=..
notify_cost_1=.. notify_cost_1000=.. writers_rate_ratio=..`` (cost: notified seconds over
not notified; ratio: notified rate over not notified).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import uuid

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.queue import NewItem, QueueStore
from asynctier.queue.shards import ShardedQueue
from asynctier.tailers.queue import QueueSource
from bench.stack import postgres


def pickups(queue: ShardedQueue, store: QueueStore, ns: str, items: int
            ) -> dict[str, list[float]]:
    """Seconds from enqueue to lease, per source ("notified", "poll")."""
    sources = {}
    for name in ("notified", "poll"):
        binding = Binding(name=name, source=Source("queue", name), function="m:f", tenant=ns)
        sources[name] = QueueSource(binding, queue, f"bench-{name}", threading.Event())
    sources["poll"].close()  # its wake-up is never set: the poll alone
    sources["poll"]._woken = threading.Event()
    leased: dict[str, float] = {}
    stop = threading.Event()

    def lease_loop(source: QueueSource) -> None:
        while not stop.is_set():
            for item in source.read(100, 0.5):
                leased.setdefault(item.id, time.monotonic())  # not a lease run out

    threads = [threading.Thread(target=lease_loop, args=(s,)) for s in sources.values()]
    for t in threads:
        t.start()
    enqueued: dict[str, tuple[str, float]] = {}
    rng = random.Random(7)
    for n in range(items):
        for name in sources:
            time.sleep(rng.uniform(0.02, 0.2))  # idle gaps, so each source polls
            store.enqueue(ns, [NewItem(name, b"{}", id=f"{name}-{n}")])
            enqueued[f"{name}-{n}"] = (name, time.monotonic())
    deadline = time.monotonic() + 10
    while len(leased) < len(enqueued) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    sources["notified"].close()
    out: dict[str, list[float]] = {name: [] for name in sources}
    for item_id, (name, at) in enqueued.items():
        out[name].append(leased[item_id] - at)
    return out


def enqueue_cost(store: QueueStore, ns: str, batch: int, rounds: int) -> float:
    """Median seconds of a notified batch over a not-notified one, interleaved."""
    notified, quiet = [], []
    for r in range(rounds * 10):
        for kind, out in (("n", notified), ("q", quiet))[:: 1 if r % 2 else -1]:
            items = [NewItem("cost", b'{"pad": "0123456789abcdef"}', id=uuid.uuid4().hex,
                             deliver_after_ms=None if kind == "n" else 0)
                     for _ in range(batch)]
            t = time.perf_counter()
            store.enqueue(ns, items)
            out.append(time.perf_counter() - t)
    return statistics.median(notified) / statistics.median(quiet)


def _write(store: QueueStore, ns: str, w: int, notified: bool, until: float,
           counts: list[int]) -> None:
    """Writer ``w``: single items to its own topic until ``until``, counted."""
    while time.monotonic() < until:
        store.enqueue(ns, [NewItem(f"writer{w}", b'{"pad": "0123456789"}',
                                   deliver_after_ms=None if notified else 0)])
        counts[w] += 1


def writers_cost(dsn: str, ns: str, writers: int, seconds: float, rounds: int) -> float:
    """Median over interleaved rounds of the rate of ``writers`` threads enqueueing single
    ready items for ``seconds`` (each its own topic and connection), notified over not
    notified: PostgreSQL serializes the commits of notifying transactions."""
    ratios = []
    with QueueStore(dsn, pool_size=writers) as store:
        for r in range(rounds):
            rates = {}
            for kind in ("n", "q")[:: 1 if r % 2 else -1]:
                counts = [0] * writers
                until = time.monotonic() + seconds
                threads = [threading.Thread(target=_write,
                                            args=(store, ns, w, kind == "n", until, counts))
                           for w in range(writers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                rates[kind] = sum(counts) / seconds
            print(f"   {writers} writers, round {r + 1}: notified {rates['n']:,.0f}/s, not "
                  f"notified {rates['q']:,.0f}/s", flush=True)
            ratios.append(rates["n"] / rates["q"])
    return statistics.median(ratios)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    ns = f"pickup{uuid.uuid4().hex[:8]}"
    with postgres() as pg, ShardedQueue([pg.dsn]) as queue:
        store = QueueStore(pg.dsn)
        store.migrate()
        got = pickups(queue, store, ns, args.items)
        for name, values in got.items():
            print(f"{name:9s} pickup of {len(values)} single items: p50 {pct(values, 0.5):.1f} ms "
                  f"p99 {pct(values, 0.99):.1f} ms max {max(values) * 1000:.1f} ms")
        costs = {b: enqueue_cost(store, ns, b, args.rounds) for b in (1, 1000)}
        for b, c in costs.items():
            print(f"enqueue of {b:,} ready item(s): notified / not notified = {c:.2f}")
        many = writers_cost(pg.dsn, ns, args.writers, args.seconds, args.rounds)
        print(f"{args.writers} writers of single items: notified / not notified rate = "
              f"{many:.2f}")
        store.close()
    n, p = got["notified"], got["poll"]
    print(f"pickup_p50_ms={pct(n, 0.5):.1f} pickup_p99_ms={pct(n, 0.99):.1f} "
          f"poll_p50_ms={pct(p, 0.5):.1f} poll_p99_ms={pct(p, 0.99):.1f} "
          f"notify_cost_1={costs[1]:.2f} notify_cost_1000={costs[1000]:.2f} "
          f"writers_rate_ratio={many:.2f}")


if __name__ == "__main__":
    main()

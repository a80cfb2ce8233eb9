"""Enqueue latency with a synchronous standby at a simulated distance (run as root).

The standby streams from its primary through a relay that holds every chunk half the RTT
in each direction (netem is not available in this machine's kernel: ``tc qdisc add ...
netem`` says "Specified qdisc kind is unknown"; a relay adds no loss or jitter, only the
delay). One enqueue (one item, one commit) is timed, its median and
p99 over ``--n`` runs, for: no standby, an asynchronous standby at the RTT, a
synchronous one at the RTT (``synchronous_commit = on``: the commit waits for the
standby's flush) — and a batch of 100 items too, which pays the RTT once.

    .venv/bin/python -m bench.standby_rtt --rtt-ms 20 --n 200

Removes its servers and their folders at the end. Compare against ``--rtt-ms 0``: the
relay costs time of its own (about 45 ms a commit on a loaded 2-core machine); the
difference between the two runs is the distance's. Measured 2026-12-01 (load 17-25):
sync 1 item 53 ms at 0, 72 ms at 20 ms RTT; 100 items 70 and 91 ms.
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from asynctier.dev.postgres import PostgresNode
from asynctier.dev.process import HOST, free_port
from asynctier.dev.replica import STANDBY_NAME, StandbyNode, primary_settings
from asynctier.queue.items import NewItem
from asynctier.queue.store import QueueStore


class DelayProxy:
    """A TCP relay on loopback that holds every chunk ``one_way_s`` before passing it on,
    in each direction, in order: the standby's distance from its primary."""

    def __init__(self, target_port: int, one_way_s: float) -> None:
        self.target_port = target_port
        self.one_way_s = one_way_s
        self.port = free_port()
        self._stop = threading.Event()
        self._server = socket.create_server((HOST, self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting (open relays end with their sockets)."""
        self._stop.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection((HOST, self.target_port))
            for src, dst in ((client, upstream), (upstream, client)):
                held: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(src, held), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, held), daemon=True).start()

    def _read(self, src: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            held.put((time.monotonic() + self.one_way_s, data))
            if not data:
                return

    @staticmethod
    def _write(dst: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            due, data = held.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if not data:
                dst.close()
                return
            try:
                dst.sendall(data)
            except OSError:
                return


class FarStandby(StandbyNode):
    """A standby that streams from its primary through a :class:`DelayProxy`."""

    proxy_port: int = 0

    @property
    def primary_conninfo(self) -> str:
        """The proxy's port instead of the primary's."""
        assert self.primary is not None
        return super().primary_conninfo.replace(f"port={self.primary.port}",
                                                f"port={self.proxy_port}")


def timed_enqueues(store: QueueStore, n: int, size: int) -> list[float]:
    """Milliseconds of ``n`` enqueues of ``size`` items each."""
    out = []
    for i in range(n):
        items = [NewItem("t", b"x" * 100, id=f"{size}-{i}-{j}-{time.time_ns()}")
                 for j in range(size)]
        t0 = time.perf_counter()
        store.enqueue("bench", items)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    """Median and p99."""
    ms = sorted(ms)
    return {"median_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2)}


def set_sync(primary: PostgresNode, names: str) -> None:
    """synchronous_standby_names on the primary (reloaded)."""
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        want = "sync" if names else "async"
        while time.monotonic() < deadline:
            row = conn.execute("SELECT sync_state FROM pg_stat_replication "
                               "WHERE state = 'streaming'").fetchone()
            if row and row[0] == want:
                return
            time.sleep(0.1)
    raise RuntimeError(f"the standby did not stream as {want} within 30 s")


def main() -> None:
    """Measure and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="asynctier-rtt-"))
    root.chmod(0o755)
    primary = PostgresNode(root / "primary", free_port(), settings=primary_settings())
    standby = FarStandby(root / "standby", free_port(), primary=primary)
    result: dict[str, object] = {"rtt_ms": args.rtt_ms, "n": args.n}
    proxy = None
    try:
        primary.start()
        proxy = DelayProxy(primary.port, args.rtt_ms / 2000)
        standby.proxy_port = proxy.port
        standby.start()
        with QueueStore(primary.dsn, pool_size=1) as store:
            store.migrate()
            set_sync(primary, "")
            timed_enqueues(store, 20, 1)  # warm up
            result["async_1"] = summary(timed_enqueues(store, args.n, 1))
            result["async_100"] = summary(timed_enqueues(store, max(20, args.n // 5), 100))
            set_sync(primary, f'"{STANDBY_NAME}"')
            result["sync_1"] = summary(timed_enqueues(store, args.n, 1))
            result["sync_100"] = summary(timed_enqueues(store, max(20, args.n // 5), 100))
    finally:
        standby.stop(10.0)
        primary.stop(10.0)
        if proxy is not None:
            proxy.close()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

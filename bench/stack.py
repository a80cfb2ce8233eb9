"""The services a benchmark run uses, and what the machine is.

A run starts its own Kafka and Redis (the dev-stack code, free loopback ports, a temporary
folder) unless ``ASYNCTIER_KAFKA_BOOTSTRAP`` and ``ASYNCTIER_REDIS_URL`` point at running
ones; either way :class:`Services` says where they are and, when known, their process ids
(to count the brokers' CPU).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from asynctier import dev as devstack


@dataclass(frozen=True)
class Services:
    """Where Kafka and Redis are, whether this run started them, and their pids."""

    kafka_bootstrap: str
    redis_url: str
    own: bool
    kafka_pid: int | None
    redis_pid: int | None


def _pid_listening(port: int) -> int | None:
    """The pid of the process that listens on 127.0.0.1:``port`` (None when unknown)."""
    try:
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    except psutil.AccessDenied:
        return None
    return None


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/", 1)[0])


@contextlib.contextmanager
def services() -> Iterator[Services]:
    """The run's Kafka and Redis: from the environment, or started here and stopped after."""
    kafka = os.environ.get("ASYNCTIER_KAFKA_BOOTSTRAP")
    redis_url = os.environ.get("ASYNCTIER_REDIS_URL")
    if kafka and redis_url:
        first = kafka.split(",")[0]
        yield Services(kafka, redis_url, False, _pid_listening(_port_of(first)),
                       _pid_listening(_port_of(redis_url)))
        return
    with tempfile.TemporaryDirectory(prefix="asynctier-bench-") as tmp:
        root = Path(tmp)
        knode = devstack.start_test_kafka(root)
        try:
            rnode = devstack.start_test_redis(root)
            try:
                yield Services(knode.bootstrap, rnode.url, True, knode.daemon.pid(),
                               rnode.daemon.pid())
            finally:
                rnode.stop()
        finally:
            knode.stop()


@dataclass(frozen=True)
class Machine:
    """What the numbers were measured on."""

    cpu: str
    cores: int
    ram_gib: float
    python: str
    when: str


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> Machine:
    """This machine, now."""
    return Machine(
        cpu=_cpu_model(),
        cores=psutil.cpu_count(logical=True) or 0,
        ram_gib=psutil.virtual_memory().total / 2**30,
        python=platform.python_version(),
        when=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


@dataclass(frozen=True)
class Postgres:
    """Where the benchmark's PostgreSQL is, whether this run started it, its postmaster."""

    dsn: str
    own: bool
    pid: int | None


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """The run's PostgreSQL: the first of ``ASYNCTIER_QUEUE_SHARDS`` when set, else a server
    started here on a free loopback port (``start_test_postgres``) and stopped after."""
    shards = [s.strip() for s in os.environ.get("ASYNCTIER_QUEUE_SHARDS", "").split(",")
              if s.strip()]
    if shards:
        port = urllib.parse.urlsplit(shards[0]).port or 5432
        yield Postgres(shards[0], False, _pid_listening(port))
        return
    with tempfile.TemporaryDirectory(prefix="asynctier-bench-pg-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # as root, the server runs as an unprivileged user
        node = devstack.start_test_postgres(root)
        try:
            yield Postgres(node.dsn, True, node.daemon.pid())
        finally:
            node.stop()

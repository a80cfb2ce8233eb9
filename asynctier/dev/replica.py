"""A PostgreSQL primary and its synchronous streaming standby, for tests and for users.

The primary waits, for every commit, until its standby has flushed the commit's WAL
(``synchronous_standby_names`` names the standby, ``synchronous_commit = on``): what it
acknowledged is on both disks. The standby is a ``pg_basebackup`` copy of the primary
that streams from it (``standby.signal``, ``primary_conninfo``) and answers read-only
queries (hot standby). ``asynctier queue failover`` promotes it.

The standby itself names no synchronous standby: once promoted it runs alone (its commits
are acknowledged from its own disk) until a new standby is built from it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.postgres import DEV_SETTINGS, SUPERUSER, PostgresNode, _group_of
from asynctier.dev.process import HOST, pid_alive
from asynctier.platform.errors import ServiceError

#: The standby's ``application_name``, which the primary's synchronous_standby_names names.
STANDBY_NAME = "asynctier_standby"
#: WAL the primary keeps for a standby that fell behind (no replication slot: a standby
#: dropped for good must not make the primary keep WAL forever).
WAL_KEEP = "256MB"


def primary_settings() -> dict[str, str]:
    """The dev settings plus what a primary with a standby needs; its
    ``synchronous_standby_names`` is set by :func:`make_synchronous` once the standby runs
    (before, every commit would wait for a standby that is not there yet), with ALTER
    SYSTEM so that it holds after a restart too (the fence of an old primary)."""
    return {**DEV_SETTINGS, "wal_level": "replica", "max_wal_senders": "5",
            "wal_keep_size": WAL_KEEP, "synchronous_commit": "on"}


def make_synchronous(primary: PostgresNode, standby_name: str = STANDBY_NAME,
                     timeout_s: float = 30.0) -> None:
    """Make ``standby_name`` the primary's synchronous standby (ALTER SYSTEM, reload) and
    wait until the primary reports it ``sync``."""
    import time

    import psycopg

    with psycopg.connect(primary.dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '\"{standby_name}\"'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = conn.execute("SELECT sync_state FROM pg_stat_replication "
                               "WHERE application_name = %s", (standby_name,)).fetchone()
            if row is not None and row[0] == "sync":
                return
            time.sleep(0.1)
    raise ServiceError(f"the standby {standby_name!r} did not become the synchronous "
                       f"standby of {primary.address} within {timeout_s:.0f} s: see its log "
                       "(postgres.out in its folder)")


@dataclass
class StandbyNode(PostgresNode):
    """A hot standby of ``primary``: its first start copies the primary (pg_basebackup)
    instead of running initdb; it streams from the primary as ``standby_name``."""

    primary: PostgresNode | None = None
    standby_name: str = STANDBY_NAME
    settings: Mapping[str, str] = field(default_factory=lambda: dict(DEV_SETTINGS))

    def _argv(self, bin_dir: Path) -> list[str]:
        return [*super()._argv(bin_dir), "-c", f"primary_conninfo={self.primary_conninfo}",
                "-c", "hot_standby=on", "-c", "wal_receiver_status_interval=1s"]

    @property
    def primary_conninfo(self) -> str:
        """How the standby reaches its primary (key=value, as primary_conninfo takes)."""
        if self.primary is None:
            raise ServiceError(f"standby {self.data_dir} has no primary to copy: give one")
        parts = [f"host={HOST}", f"port={self.primary.port}", f"user={SUPERUSER}",
                 f"application_name={self.standby_name}"]
        if self.primary.password:
            parts.append(f"password={self.primary.password}")
        return " ".join(parts)

    def _initdb(self, bin_dir: Path, user: str | None) -> None:
        """pg_basebackup of the primary into the (empty) cluster folder, then
        ``standby.signal``."""
        if self.primary is None:
            raise ServiceError(f"standby {self.data_dir} has no primary to copy: give one")
        argv = [str(bin_dir / "pg_basebackup"), "-D", str(self.cluster_dir),
                "-h", HOST, "-p", str(self.primary.port), "-U", SUPERUSER,
                "-X", "stream", "-c", "fast", "--no-password"]
        env = dict(os.environ)
        if self.primary.password:
            env["PGPASSWORD"] = self.primary.password
        done = subprocess.run(argv, cwd=self.data_dir, capture_output=True, text=True,
                              timeout=300, check=False, env=env, user=user,
                              group=None if user is None else _group_of(user),
                              extra_groups=None if user is None else [])
        if done.returncode != 0:
            raise ServiceError(f"pg_basebackup of the primary {self.primary.address} into "
                               f"{self.cluster_dir} failed (exit {done.returncode}): "
                               f"{done.stderr.strip()}; is the primary running?")
        signal_file = self.cluster_dir / "standby.signal"
        signal_file.touch()
        if user is not None:
            import shutil

            shutil.chown(signal_file, user, _group_of(user))

    def _create_database(self) -> None:
        """Nothing: the database came with the copy (a standby cannot create one)."""


def crash(node: PostgresNode) -> bool:
    """SIGKILL the server's whole process group (postmaster and every backend), as when
    its machine is lost; True when it ran."""
    pid = node.daemon.pid()
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    import time

    deadline = time.monotonic() + 10.0
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    node.daemon.pid_file.unlink(missing_ok=True)
    return True


def pair_dsn(primary: PostgresNode, standby: PostgresNode) -> str:
    """A shard's address with its standby: ``postgresql://user@primary,standby/db``."""
    auth = f"{SUPERUSER}:{primary.password}" if primary.password else SUPERUSER
    return (f"postgresql://{auth}@{HOST}:{primary.port},{HOST}:{standby.port}/"
            f"{primary.dsn.rsplit('/', 1)[1]}")

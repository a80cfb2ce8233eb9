"""Shard addresses: as people and logs may see them (without the password), and a
shard's hosts (its primary and standbys) with which of them is the primary now.

A shard with a standby is one multi-host address, the primary first:
``postgresql://user@primary:5432,standby:5432/db``. The shard keeps the first host's name
(:func:`redact_dsn`) whichever host is primary, so adding a standby or failing over moves
no topic to another shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from asynctier.platform.errors import ConfigError

#: What a host says of itself: in recovery (a standby)? read-only (fenced)? its timeline
#: (a primary's; a promotion starts a new, higher one)? streaming from a primary?
PROBE_SQL = """
SELECT pg_is_in_recovery(),
       current_setting('default_transaction_read_only') = 'on',
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE pg_walfile_name(pg_current_wal_lsn()) END,
       EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming')
"""


def _parts(dsn: str) -> dict[str, str]:
    try:
        return {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    except Exception as exc:  # psycopg.ProgrammingError; never echo the DSN itself
        raise ConfigError("a queue shard's address is not a PostgreSQL connection string: "
                          "write postgresql://user@host:port/dbname (a standby after a "
                          "comma: postgresql://user@primary:port,standby:port/dbname)"
                          ) from exc


def redact_dsn(dsn: str) -> str:
    """``postgresql://user@host:port/dbname`` of ``dsn`` (URL or key=value), password
    left out; of a multi-host address, its first host. Raises ConfigError when ``dsn`` is
    not a connection string."""
    parts = _parts(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = (parts.get("host") or "localhost").split(",")[0]
    port = parts.get("port", "").split(",")[0]
    port = f":{port}" if port else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"


def shard_hosts(dsn: str) -> list[str]:
    """One single-host address per host of ``dsn``, in its order (the primary first);
    one port applies to every host, else give one per host."""
    parts = _parts(dsn)
    hosts = (parts.pop("host", "") or "localhost").split(",")
    ports = parts.pop("port", "").split(",")
    parts.pop("hostaddr", None)
    if len(ports) not in (1, len(hosts)):
        raise ConfigError(f"queue shard {redact_dsn(dsn)}: {len(hosts)} hosts but "
                          f"{len(ports)} ports; give one port, or one per host")
    if len(ports) == 1:
        ports = ports * len(hosts)
    parts.pop("target_session_attrs", None)  # the shard chooses its host itself
    return [make_conninfo(**parts, host=h, **({"port": p} if p else {}))
            for h, p in zip(hosts, ports, strict=True)]


@dataclass(frozen=True)
class HostState:
    """What one host of a shard answered (:data:`PROBE_SQL`)."""

    dsn: str
    in_recovery: bool
    read_only: bool
    timeline: int | None
    streaming: bool

    @property
    def name(self) -> str:
        """The host's address without the password."""
        return redact_dsn(self.dsn)

    @property
    def writable(self) -> bool:
        """A primary that takes writes (not a standby, not fenced read-only)."""
        return not self.in_recovery and not self.read_only

    def describe(self) -> str:
        """``primary (timeline 2)``, ``standby (streaming)``, ``fenced (timeline 1)``."""
        if self.in_recovery:
            return "standby (streaming)" if self.streaming else "standby (not streaming)"
        role = "fenced, read-only" if self.read_only else "primary"
        return f"{role} (timeline {self.timeline})"


def probe(dsn: str, timeout_s: float = 2.0) -> HostState | None:
    """The state of the host at ``dsn``, or None when it does not answer."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, int(timeout_s)),
                             application_name="asynctier-probe") as conn:
            row = conn.execute(PROBE_SQL).fetchone()
    except psycopg.Error:
        return None
    if row is None:
        return None
    in_recovery, read_only, walfile, streaming = row
    timeline = None if walfile is None else int(str(walfile)[:8], 16)
    return HostState(dsn, bool(in_recovery), bool(read_only), timeline, bool(streaming))


def choose_primary(states: list[HostState | None], min_timeline: int = 0
                   ) -> HostState | None:
    """The writable host on the highest timeline (the first listed on a tie), never one
    below ``min_timeline`` (a primary that was failed over from and came back)."""
    writable = [s for s in states if s is not None and s.writable
                and (s.timeline or 0) >= min_timeline]
    if not writable:
        return None
    best = max(s.timeline or 0 for s in writable)
    return next(s for s in writable if (s.timeline or 0) == best)

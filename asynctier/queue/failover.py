"""Failing a queue shard over to its standby: by hand (:func:`fail_over`) or by a watcher
(:func:`watch`) when the primary has not answered for a detection time.

Promotion is ``pg_promote()`` on the standby, which then starts a new timeline; clients
move to it by themselves (:mod:`asynctier.queue.route`). What fences the old primary:

1. Synchronous replication: it names the standby in ``synchronous_standby_names`` (set
   with ALTER SYSTEM, so a restart keeps it) and every commit waits for that standby's
   flush. The promoted standby follows it no more, so the old primary acknowledges no
   commit again: no enqueue, lease or ack can be confirmed there.
2. When it answers (a switchover, or it came back), it is made read-only
   (``default_transaction_read_only``, ALTER SYSTEM) and its client sessions are ended,
   so clients leave it; the watcher does this to any writable host on a lower timeline.
3. Clients choose the writable host on the highest timeline and never one below a
   timeline they have seen.

The watcher promotes only when the standby, too, has lost the primary (its WAL receiver
is not streaming): a watcher cut off from a primary that still serves its standby does
nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from asynctier.platform.errors import QueueError
from asynctier.queue.dsn import HostState, choose_primary, probe, redact_dsn, shard_hosts

log = logging.getLogger(__name__)

#: How often the watcher asks every host of every shard.
WATCH_EVERY_S = 0.5
#: The statements that fence a primary: read-only from now on (and after a restart), its
#: client sessions ended so that their next connection finds the new primary.
FENCE_SQL = (
    "ALTER SYSTEM SET default_transaction_read_only = on",
    "SELECT pg_reload_conf()",
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
)


@dataclass(frozen=True)
class Promotion:
    """What a failover did."""

    shard: str
    promoted: str
    timeline: int | None
    fenced: tuple[str, ...]
    took_s: float

    def describe(self) -> str:
        """One line for the operator."""
        fenced = (f"; fenced {', '.join(self.fenced)} (read-only, sessions ended)"
                  if self.fenced else "; the old primary did not answer (its synchronous "
                  "standby is gone: it can confirm no commit)")
        return (f"queue shard {self.shard}: promoted {self.promoted} to primary (timeline "
                f"{self.timeline}) in {self.took_s:.2f} s{fenced}")


def fence(dsn: str, timeout_s: float = 2.0) -> bool:
    """Make the host at ``dsn`` read-only and end its client sessions; False when it
    does not answer."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, int(timeout_s)),
                             application_name="asynctier-failover") as conn:
            for statement in FENCE_SQL:
                conn.execute(statement)
    except psycopg.Error as exc:
        log.info("fencing %s: %s", redact_dsn(dsn), exc)
        return False
    return True


def promote(dsn: str, wait_s: float = 60.0) -> HostState:
    """``pg_promote()`` on the standby at ``dsn``; its state once it is primary."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5,
                             application_name="asynctier-failover") as conn:
            row = conn.execute("SELECT pg_promote(true, %s)", (int(wait_s),)).fetchone()
    except psycopg.Error as exc:
        raise QueueError(f"promoting the standby {redact_dsn(dsn)} failed ({exc}): is it "
                         "running, and still a standby?") from exc
    state = probe(dsn)
    if not row or not row[0] or state is None or not state.writable:
        raise QueueError(f"the standby {redact_dsn(dsn)} did not become primary within "
                         f"{wait_s:.0f} s: see its server log")
    return state


def fail_over(dsn: str, wait_s: float = 60.0) -> Promotion:
    """Promote the shard's standby; fence every other host that answers first (so that
    none takes writes while the standby becomes primary)."""
    name = redact_dsn(dsn)
    hosts = shard_hosts(dsn)
    if len(hosts) < 2:
        raise QueueError(f"queue shard {name} has no standby: list one after its primary "
                         "(postgresql://user@primary:port,standby:port/db)")
    started = time.monotonic()
    states = {h: probe(h) for h in hosts}
    standby = next((h for h, s in states.items() if s is not None and s.in_recovery), None)
    if standby is None:
        seen = ", ".join(f"{redact_dsn(h)}: {s.describe() if s else 'no answer'}"
                         for h, s in states.items())
        raise QueueError(f"queue shard {name} has no standby in recovery to promote "
                         f"({seen}); build a new standby from the primary first")
    fenced = tuple(redact_dsn(h) for h, s in states.items()
                   if s is not None and s.writable and fence(h))
    state = promote(standby, wait_s)
    return Promotion(name, redact_dsn(standby), state.timeline, fenced,
                     time.monotonic() - started)


@dataclass
class _Watched:
    """One shard under watch: when its primary last answered, the highest timeline."""

    dsn: str
    hosts: list[str]
    last_ok: float
    timeline: int = 0


def watch(dsns: Sequence[str], after_s: float, stop: threading.Event,
          on_promotion: Callable[[Promotion], None] | None = None,
          every_s: float = WATCH_EVERY_S) -> None:
    """Until ``stop``: promote a shard's standby once no host has been a writable primary
    for ``after_s`` and the standby streams from none; fence writable hosts on a lower
    timeline than the primary's."""
    now = time.monotonic()
    shards = [_Watched(d, shard_hosts(d), now) for d in dsns if len(shard_hosts(d)) > 1]
    if not shards:
        raise QueueError("no queue shard has a standby to fail over to: list one after its "
                         "primary (postgresql://user@primary:port,standby:port/db)")
    while not stop.is_set():
        for shard in shards:
            promotion = _check(shard, after_s)
            if promotion is not None and on_promotion is not None:
                on_promotion(promotion)
        stop.wait(every_s)


def _check(shard: _Watched, after_s: float) -> Promotion | None:
    asked = time.monotonic()  # a primary that answers answered at most this long ago
    states = [probe(h) for h in shard.hosts]
    primary = choose_primary(states, shard.timeline)
    now = time.monotonic()
    if primary is not None:
        shard.last_ok = asked
        shard.timeline = max(shard.timeline, primary.timeline or 0)
        for s in states:
            if s is not None and s.writable and (s.timeline or 0) < shard.timeline:
                log.warning("queue shard %s: host %s is writable on timeline %s, behind "
                            "the primary's %s: fencing it", redact_dsn(shard.dsn), s.name,
                            s.timeline, shard.timeline)
                fence(s.dsn)
        return None
    if now - shard.last_ok < after_s:
        return None
    standbys = [s for s in states if s is not None and s.in_recovery]
    if not standbys:
        return None
    if any(s.streaming for s in standbys):
        log.warning("queue shard %s: its primary does not answer here, but the standby "
                    "still streams from it; not promoting (this watcher may be cut off)",
                    redact_dsn(shard.dsn))
        return None
    down_for = now - shard.last_ok
    state = promote(standbys[0].dsn)
    shard.timeline = max(shard.timeline, state.timeline or 0)
    shard.last_ok = time.monotonic()
    promotion = Promotion(redact_dsn(shard.dsn), state.name, state.timeline, (),
                          shard.last_ok - now)
    log.warning("%s; no primary had answered for %.1f s", promotion.describe(), down_for)
    return promotion

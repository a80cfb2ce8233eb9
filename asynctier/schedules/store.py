"""Schedules in PostgreSQL, beside the queue: add, list, pause, resume, remove.

A schedule's row lives on the shard of the queue topic it feeds (``ShardedQueue.route_of``),
so the firing (:mod:`asynctier.schedules.fire`) commits a tick's item and the schedule's
advance in one transaction. Names are unique per namespace across shards: ``add`` looks
on every shard first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import psycopg

from asynctier.platform.errors import ScheduleError
from asynctier.queue.shards import ShardedQueue
from asynctier.queue.store import QueueStore
from asynctier.schedules import sql
from asynctier.schedules.spec import Schedule, iso


@dataclass(frozen=True)
class ScheduleInfo:
    """A stored schedule and its state. ``schedule`` is None when the stored row is not a
    valid schedule (``error`` says why; such a schedule is paused and never fires).
    ``lateness_s``: how late its last tick fired."""

    namespace: str
    name: str
    schedule: Schedule | None
    version: int
    paused: bool
    next_ms: int
    last_tick_ms: int | None
    last_fired_ms: int | None
    lateness_s: float | None
    fired: int
    skipped: int
    error: str
    now_ms: int

    @property
    def state(self) -> str:
        """``active``, ``paused`` or ``broken`` (its stored row is refused)."""
        if self.schedule is None or self.error:
            return "broken"
        return "paused" if self.paused else "active"

    def doc(self) -> dict[str, Any]:
        """What ``schedule list --json``, ``schedule show`` and the console show of it."""
        s = self.schedule
        return {
            "name": self.name, "namespace": self.namespace, "state": self.state,
            "when": s.when() if s else None, "topic": s.topic if s else None,
            "target": s.target if s else None,
            "version": self.version, "next": iso(self.next_ms),
            "next_in_s": (self.next_ms - self.now_ms) / 1000.0,
            "last_tick": None if self.last_tick_ms is None else iso(self.last_tick_ms),
            "lateness_s": self.lateness_s, "fired": self.fired, "skipped": self.skipped,
            "catch_up": s.catch_up if s else None, "payload": s.payload if s else None,
            "priority": s.priority if s else None, "expire_s": s.expire_s if s else None,
            "error": self.error,
        }


def read_row(row: tuple[Any, ...]) -> ScheduleInfo:
    """One row of ``sql.COLUMNS`` + the database's now, checked as a new schedule is."""
    (namespace, name, topic, cron, every_s, timezone, payload, priority, expire_s, catch_up,
     catch_up_max, grace_s, version, paused, next_ms, last_tick_ms, last_fired_ms,
     lateness_ms, fired, skipped, error, target, now_ms) = row
    schedule: Schedule | None = None
    try:
        schedule = Schedule(namespace=namespace, name=name, topic=topic, cron=cron,
                            every_s=every_s, timezone=timezone, payload=payload,
                            priority=priority, expire_s=expire_s, catch_up=catch_up,
                            catch_up_max=catch_up_max, grace_s=grace_s, target=target)
    except (ScheduleError, TypeError) as exc:
        error = error or f"its stored row is refused: {exc}"
    return ScheduleInfo(namespace=str(namespace), name=str(name), schedule=schedule,
                        version=int(version), paused=bool(paused), next_ms=int(next_ms),
                        last_tick_ms=last_tick_ms, last_fired_ms=last_fired_ms,
                        lateness_s=None if lateness_ms is None else lateness_ms / 1000.0,
                        fired=int(fired), skipped=int(skipped), error=str(error),
                        now_ms=int(now_ms))


def _params(schedule: Schedule, next_ms: int) -> dict[str, Any]:
    return {**dataclasses.asdict(schedule), "next_ms": next_ms}


class ScheduleStore:
    """The schedules of every shard of a :class:`ShardedQueue` (the SDK's and the CLI's
    way to them; each method is one short transaction on one shard)."""

    def __init__(self, queue: ShardedQueue) -> None:
        self.queue = queue

    def add(self, schedule: Schedule, replace: bool = False) -> ScheduleInfo:
        """Store ``schedule``; its first tick is the first after now (the database's
        clock). A name already used in the namespace is refused unless ``replace``: then
        the definition is replaced (a new version; a firing under way finishes first)."""
        old = self.get(schedule.namespace, schedule.name)
        if old is not None and not replace:
            raise ScheduleError(
                f"schedule {schedule.name!r} exists in namespace {schedule.namespace!r}: "
                "pass --replace to change it, or remove it first")
        route = self.queue.route_of(schedule.namespace, schedule.queue_topic)
        if (old is not None and old.schedule is not None
                and old.schedule.queue_topic != schedule.queue_topic):
            old_route = self.queue.route_of(old.namespace, old.schedule.queue_topic)
            if old_route is not route:  # another shard: remove there, add here
                self.remove(old.namespace, old.name)
                old = None
        statement = sql.REPLACE if old is not None else sql.INSERT

        def write(store: QueueStore) -> None:
            with store.transaction() as conn:
                now_ms = _now(conn)
                if conn.execute(statement, _params(schedule, schedule.after(now_ms))
                                ).fetchone() is None:
                    raise ScheduleError(f"schedule {schedule.name!r} changed while it was "
                                        "being written: try again")

        route.call(write)
        info = self.get(schedule.namespace, schedule.name)
        assert info is not None
        return info

    def get(self, namespace: str, name: str) -> ScheduleInfo | None:
        """One schedule, or None."""
        for route in self.queue.routes:
            row = route.call(lambda s: _one(s, sql.GET, (namespace, name)))
            if row is not None:
                return read_row(row)
        return None

    def list(self, namespace: str) -> list[ScheduleInfo]:
        """Every schedule of ``namespace``, by name."""
        rows = [r for route in self.queue.routes
                for r in route.call(lambda s: _all(s, sql.LIST, (namespace,)))]
        return sorted((read_row(r) for r in rows), key=lambda i: i.name)

    def pause(self, namespace: str, name: str) -> ScheduleInfo:
        """Stop firing (ticks while paused are not fired later)."""
        return self._change(namespace, name, lambda conn, info: conn.execute(
            sql.PAUSE, (namespace, name)))

    def resume(self, namespace: str, name: str) -> ScheduleInfo:
        """Fire again from the first tick after now."""
        def resume(conn: psycopg.Connection[Any], info: ScheduleInfo) -> None:
            if info.schedule is None:
                raise ScheduleError(f"schedule {name!r} cannot resume: {info.error}; add it "
                                    "again with --replace")
            conn.execute(sql.RESUME, {"namespace": namespace, "name": name,
                                      "next_ms": info.schedule.after(info.now_ms)})

        return self._change(namespace, name, resume)

    def remove(self, namespace: str, name: str) -> bool:
        """Delete the schedule (its items already enqueued stay); False when none."""
        return any(route.call(lambda s: _one(s, sql.DELETE, (namespace, name))) is not None
                   for route in self.queue.routes)

    def _change(self, namespace: str, name: str, change: Any) -> ScheduleInfo:
        for route in self.queue.routes:
            def apply(store: QueueStore) -> bool:
                with store.transaction() as conn:
                    row = conn.execute(sql.GET_LOCKED, (namespace, name)).fetchone()
                    if row is None:
                        return False
                    change(conn, read_row(row))
                    return True

            if route.call(apply):
                info = self.get(namespace, name)
                assert info is not None
                return info
        raise ScheduleError(f"no schedule {name!r} in namespace {namespace!r} "
                            "(`asynctier schedule list` shows them)")


def _now(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(sql.CLOCK).fetchone()
    assert row is not None
    return int(row[0])


def _one(store: QueueStore, query: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    with store.transaction() as conn:
        row: tuple[Any, ...] | None = conn.execute(query, args).fetchone()
        return row


def _all(store: QueueStore, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    with store.transaction() as conn:
        return list(conn.execute(query, args).fetchall())

"""Firing: each due tick becomes one queue item, exactly once, from any number of processes.

One round on one shard is one transaction: lock the due schedules (``FOR UPDATE SKIP
LOCKED``: another process firing some now keeps them), enqueue the ticks' items
(:func:`~asynctier.queue.store.enqueue_in`, ids ``schedule:<name>:<tick>``), move each
schedule's ``next_ms`` past them, commit. A process killed in the middle commits nothing
and another fires those ticks; a tick committed once is behind ``next_ms`` for everyone.
The ids make a second enqueue of a tick a no-op as well, so even a schedule replaced by an
older copy of itself cannot enqueue a tick twice while its item is there.

"Due" is by the database's clock (``next_ms <= now()``), never the process's: a process
whose clock runs ahead fires nothing early, and every item is ``deliver_after`` its tick.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asynctier.queue.items import NewItem
from asynctier.queue.store import QueueStore, enqueue_in
from asynctier.schedules import relay, sql
from asynctier.schedules.spec import Schedule, plan
from asynctier.schedules.store import ScheduleInfo, read_row

log = logging.getLogger(__name__)

#: The most schedules one round locks and fires on one shard.
FIRE_BATCH = 500


@dataclass
class Round:
    """What one round fired on one shard: per tick fired, (schedule, tick ms, lateness s);
    ``skipped``: missed ticks left out by their catch-up policy; ``broken``: schedules
    paused because their stored row is refused."""

    fired: list[tuple[str, int, float]] = field(default_factory=list)
    skipped: int = 0
    broken: list[str] = field(default_factory=list)
    now_ms: int = 0


def fire_due(store: QueueStore, limit: int = FIRE_BATCH,
             namespaces: Sequence[str] | None = None) -> Round:
    """Fire the due ticks of up to ``limit`` schedules of this shard (of ``namespaces``
    only, when given), in one transaction."""
    out = Round()
    params = {"limit": limit, "namespaces": _list(namespaces)}
    with store.transaction() as conn:
        infos = [read_row(r) for r in conn.execute(sql.DUE, params).fetchall()]
        advance: dict[str, list[Any]] = {k: [] for k in _ADVANCE_KEYS}
        items: dict[str, list[NewItem]] = {}
        for info in infos:
            out.now_ms = info.now_ms
            if info.schedule is None:
                _break(conn, info, out)
                continue
            p = plan(info.schedule, info.next_ms, info.now_ms)
            items.setdefault(info.namespace, []).extend(_items(info.schedule, p.fire))
            last = p.fire[-1] if p.fire else None
            row = (info.namespace, info.name, p.next_ms, last,
                   None if last is None else info.now_ms - last, len(p.fire), p.skipped)
            for key, value in zip(_ADVANCE_KEYS, row, strict=True):
                advance[key].append(value)
            out.fired += [(info.name, t, (info.now_ms - t) / 1000.0) for t in p.fire]
            out.skipped += p.skipped
        for namespace, batch in items.items():
            enqueue_in(conn, namespace, batch)
        if advance["names"]:
            conn.execute(sql.ADVANCE, advance)
    return out


_ADVANCE_KEYS = ("namespaces", "names", "next_ms", "last_tick_ms", "lateness_ms", "fired",
                 "skipped")


def _items(schedule: Schedule, ticks: tuple[int, ...]) -> list[NewItem]:
    headers = () if schedule.target == "queue" else relay.outbox_headers(schedule)
    return [NewItem(schedule.queue_topic, schedule.tick_payload(t), id=schedule.item_id(t),
                    priority=schedule.priority, deliver_after_ms=t, ttl_s=schedule.expire_s,
                    headers=headers)
            for t in ticks]


def _break(conn: Any, info: ScheduleInfo, out: Round) -> None:
    log.error("schedule %s/%s is paused: %s. Fix it with `asynctier schedule add %s ... "
              "--replace` (or remove it)", info.namespace, info.name, info.error, info.name)
    conn.execute(sql.BREAK, {"namespace": info.namespace, "name": info.name,
                             "error": info.error})
    out.broken.append(info.name)


def next_due_in_s(store: QueueStore, namespaces: Sequence[str] | None = None) -> float | None:
    """Seconds (by the database's clock) until the earliest active schedule's tick (of
    ``namespaces``, when given); None when there is none."""
    with store.transaction() as conn:
        row = conn.execute(sql.NEXT_DUE, {"namespaces": _list(namespaces)}).fetchone()
    if row is None or row[0] is None:
        return None
    return max(0.0, (int(row[0]) - int(row[1])) / 1000.0)


def _list(namespaces: Sequence[str] | None) -> list[str] | None:
    return None if namespaces is None else list(namespaces)

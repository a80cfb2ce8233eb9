"""Deadlines and expiry of a binding's records (``--start-within``, ``--expire-after``).

A record's **deadline** is when it should start: the deadline its source gave
(``Item.deadline_ms``), else its record time (a Kafka record's timestamp or first-seen
time, a queue item's enqueue time) plus the binding's ``start_within_s``. Within a tier
and a tenant the scheduler runs the chunk of the earliest deadline first; a chunk of a
binding without a deadline is ordered as if it were due ``default_window_s`` after it
reached the scheduler, so it ages and is never starved by deadline work.

A record of a binding with ``expire_after_s`` that has not started by its record time plus
that is useless: it is answered ``failed`` with reason ``expired`` (a dead letter) and never
runs. The scheduler checks when a batch arrives and again when a chunk leaves the queue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.wire import EXPIRED, Item, Outcome, failed


def stamp_deadlines(binding: Binding, items: Sequence[Item]) -> None:
    """Give each item of a ``--start-within`` binding its deadline (epoch ms), unless its
    source gave one already; ``ctx.deadline`` and the queue's order read it."""
    within = binding.deadlines.start_within_s
    if within is None:
        return
    window_ms = int(within * 1000)
    for item in items:
        if item["deadline_ms"] is None:
            item["deadline_ms"] = item["record_time_ms"] + window_ms


def order_key(binding: Binding, items: Sequence[Item], now_s: float,
              default_window_s: float) -> float:
    """The deadline (epoch seconds) a chunk of ``items`` is ordered by: its earliest."""
    given = [i["deadline_ms"] for i in items if i["deadline_ms"] is not None]
    if given:
        return min(given) / 1000.0
    return now_s + default_window_s if default_window_s < math.inf else math.inf


def split_expired(binding: Binding, items: list[Item],
                  now_ms: int) -> tuple[list[Outcome], list[Item]]:
    """(``expired`` outcomes of the items past their expiry, the items still live)."""
    expire = binding.deadlines.expire_after_s
    if expire is None or not items:
        return [], items
    cut_ms = now_ms - int(expire * 1000)  # a record older than this has expired
    if all(i["record_time_ms"] > cut_ms for i in items):
        return [], items
    dead = [i for i in items if i["record_time_ms"] <= cut_ms]
    live = [i for i in items if i["record_time_ms"] > cut_ms]
    metrics.count_expired(binding.name, len(dead))
    return [failed(i["id"], _why(binding, i, now_ms), EXPIRED) for i in dead], live


def _why(binding: Binding, item: Item, now_ms: int) -> str:
    age_s = (now_ms - item["record_time_ms"]) / 1000.0
    return (f"expired: not started within --expire-after "
            f"{binding.deadlines.expire_after_s:g}s of its record time (it was {age_s:.1f}s "
            "old); not run")

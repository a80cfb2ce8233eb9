"""The ladder planner: which fixed delay topics a record hops through. Pure code.

A record that must wait ``delay`` seconds is written to the delay topic of the first hop;
each delay topic holds a record for exactly its interval. Hops are taken largest first,
and a remainder smaller than every interval is rounded up to the smallest interval that
covers it, so a plan is never early and is late by less than the smallest interval.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_hops(delay_s: float, intervals: Sequence[float]) -> list[float]:
    """The intervals to hop through, largest first, to wait at least ``delay_s``.

    >>> plan_hops(7, [1, 2, 4])
    [4, 2, 1]
    >>> plan_hops(45, [30, 60, 300, 1800])
    [60]
    """
    if not intervals:
        raise ValueError("no delay intervals to plan with")
    if delay_s <= 0:
        return []
    steps = sorted(set(intervals), reverse=True)
    hops: list[float] = []
    left = delay_s
    for step in steps:
        while left >= step:
            hops.append(step)
            left -= step
    if left > 1e-9:
        cover = min(s for s in steps if s >= left)
        hops.append(cover)
        hops.sort(reverse=True)
    return _merge(hops, steps)


def _merge(hops: list[float], steps: list[float]) -> list[float]:
    """Fewer hops where two of the same interval equal a larger one (e.g. 30+30 = 1m)."""
    changed = True
    while changed:
        changed = False
        for step in steps:
            if hops.count(step) >= 2 and 2 * step in steps:
                hops.remove(step)
                hops.remove(step)
                hops.append(2 * step)
                hops.sort(reverse=True)
                changed = True
                break
    return hops


def next_hop(remaining_s: float, intervals: Sequence[float]) -> float | None:
    """The first hop for a record that still has ``remaining_s`` to wait (None: due now).

    A wait of at least the largest interval starts with it (the plan is largest first),
    worked out without planning the rest: a wait of years is as quick as one of seconds.
    """
    if intervals and remaining_s >= max(intervals):
        return max(intervals)
    hops = plan_hops(remaining_s, intervals)
    return hops[0] if hops else None


def ladder_delay(attempt: int, ladder: Sequence[float]) -> float:
    """How long a record waits after failing attempt ``attempt`` (1-based): the last repeats."""
    if not ladder:
        raise ValueError("empty retry ladder")
    return ladder[min(max(attempt, 1), len(ladder)) - 1]

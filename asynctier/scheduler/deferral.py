"""Shifting out of peaks: ``--defer-when-busy`` (docs/design.md, Shifting out of peaks).

A scheduler is **busy** (saturated) when work of bindings that do not defer (*firm*
work) waits: a firm chunk waited at least ``waited_s`` from its arrival in the queue to
its start on a worker (all workers were taken, or the loop was behind), or firm work has
sat in the queue that long without a break. It stays busy until ``hold_s`` after the last
such wait, so that deferred work does not come back between two firm batches. A free
worker takes a chunk within a turn of the loop, so a wait of :data:`WAITED_S` means the
deferring work competes with the firm work. Each scheduler judges its own queue: a
tailer spreads a binding's calls over every live scheduler, so firm work that waits in
one waits in them all, and a scheduler with room runs deferred work at once.

While saturated, the records of a ``--defer-when-busy`` binding are **parked**: answered
``retry`` after :func:`park_s`, spending no attempt (Kafka: the delay path; queue: a nack
with that delay): when their batch arrives, when saturation begins (the dispatcher then
takes their queued chunks out of the queue: ``on_start``) and when a chunk of them leaves
the queue.
A parked record comes back and is judged again, so it runs once load falls. A record
whose deadline is near (less than :data:`RELEASE_SHARE` of its window left) is never
parked: it runs, saturated or not, so deferring cannot make it miss its deadline.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.durations import epoch_ms
from asynctier.platform.wire import Item, Outcome, retry
from asynctier.scheduler.bounded import BoundedQueue

log = logging.getLogger(__name__)

#: A firm chunk that waited this long for a worker makes the scheduler busy ...
WAITED_S = 0.01
#: ... and it stays busy this long after the last such wait.
HOLD_S = 1.0
#: A record is released (never parked) once less than this share of its window is left.
RELEASE_SHARE = 0.25
#: A parked record comes back after the binding's first ladder step, within these bounds.
MIN_PARK_S = 0.5
MAX_PARK_S = 60.0


class Saturation:
    """Whether one scheduler's queue says it is busy with firm work (logged and exported
    as ``asynctier_scheduler_saturated`` at each change)."""

    def __init__(self, queue: BoundedQueue, waited_s: float = WAITED_S,
                 hold_s: float = HOLD_S,
                 on_start: Callable[[], None] | None = None) -> None:
        self.queue = queue
        self.waited_s = waited_s
        self.hold_s = hold_s
        self.on_start = on_start  # called when it becomes saturated
        self._was = False
        queue.firm_wait_s = waited_s

    def saturated(self) -> bool:
        """True while firm work waits for a worker, and ``hold_s`` after it last did."""
        queue = self.queue
        now = queue.clock()
        since = queue.firm_since
        busy = ((since is not None and now - since >= self.waited_s)
                or now - queue.firm_waited_at < self.hold_s)
        if busy != self._was:
            self._was = busy
            metrics.set_saturated(busy)
            if busy:
                log.info("scheduler busy: work that does not defer has waited %gs or more "
                         "for a worker; records of --defer-when-busy bindings are parked "
                         "until it has not waited for %gs", self.waited_s, self.hold_s)
                if self.on_start is not None:
                    self.on_start()
            else:
                log.info("scheduler no longer busy: --defer-when-busy records run again")
        return busy


def park_s(binding: Binding, item: Item, now_ms: int) -> float | None:
    """How long to park ``item`` of a ``--defer-when-busy`` binding; None when its deadline
    is too near to park it (it runs now).

    It is parked for the binding's first ladder step (the smallest delay topic, which a
    Kafka record waits in anyway), within ``MIN_PARK_S..MAX_PARK_S``, and never past its
    release point (the deadline minus :data:`RELEASE_SHARE` of the window).
    """
    window = binding.deadlines.start_within_s
    deadline = item["deadline_ms"]
    if window is None or deadline is None:
        return None
    left_s = (deadline - now_ms) / 1000.0 - window * RELEASE_SHARE
    if left_s < MIN_PARK_S:
        return None
    return min(max(binding.retries.ladder_s[0], MIN_PARK_S), MAX_PARK_S, left_s)


def may_wait(binding: Binding, items: list[Item], now_ms: int) -> bool:
    """Whether every one of ``items`` (of ``binding``) may be parked now."""
    return binding.deadlines.defer_when_busy and all(park_s(binding, i, now_ms) is not None
                                           for i in items)


def defer(binding: Binding, items: list[Item], saturation: Saturation,
          now_ms: int | None = None) -> tuple[list[Outcome], list[Item]]:
    """(parked outcomes, items to run) of ``binding``'s items: all run unless the binding
    defers and the scheduler is saturated; then only those whose deadline is near run.
    Items must carry their deadline (:func:`~.deadlines.stamp_deadlines`)."""
    if not binding.deadlines.defer_when_busy or not items or not saturation.saturated():
        return [], items
    return park(binding, items, epoch_ms() if now_ms is None else now_ms)


def park(binding: Binding, items: list[Item],
         now_ms: int) -> tuple[list[Outcome], list[Item]]:
    """(parked outcomes, items to run): the items whose deadline is near run (counted in
    ``asynctier_deferred_total``)."""
    parked: list[Outcome] = []
    run: list[Item] = []
    why = (f"deferred: binding {binding.name} defers when busy and its scheduler is "
           "saturated by other work; no attempt spent")
    for item in items:
        after = park_s(binding, item, now_ms)
        if after is None:
            run.append(item)
        else:
            parked.append(retry(item["id"], why, after_s=math.ceil(after * 1000) / 1000,
                                spends_attempt=False))
    metrics.count_deferred(binding.name, len(parked))
    return parked, run

"""The deferral gate (``--defer-when-busy``): park deferrable work while firm work waits.

While the scheduler is saturated (:mod:`asynctier.scheduler.deferral`), a deferring
binding's records whose deadline is not near are parked (a retry that spends no attempt):
when their batch arrives, when their chunk leaves the queue, and, the moment saturation
begins, the chunks of them then queued, which are taken out of the queue and answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.durations import epoch_ms
from asynctier.platform.supervise import supervise_task
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.bounded import BoundedQueue, Chunk
from asynctier.scheduler.deferral import Saturation, defer, may_wait, park
from asynctier.scheduler.gates.base import Admitted, Gate, GateContext

#: How often the saturation is looked at while no batch asks (its gauge and log follow).
WATCH_EVERY_S = 0.5


class DeferralGate(Gate):
    """Parks a deferring binding's records while this scheduler is saturated."""

    def __init__(self, queue: BoundedQueue,
                 answer: Callable[[Chunk, list[Outcome]], None]) -> None:
        self.queue = queue
        self.answer = answer
        self.saturation = Saturation(queue, on_start=self._park_queued)
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    def build(cls, ctx: GateContext) -> DeferralGate:
        """Every scheduler has one (a binding that does not defer passes through)."""
        return cls(ctx.queue, ctx.answer)

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        """The batch's deferrable records are parked while saturated."""
        return defer(binding, items, self.saturation)

    def dequeue(self, binding: Binding, items: list[Item]) -> Admitted:
        """So are those of a chunk leaving the queue."""
        return defer(binding, items, self.saturation)

    def start(self) -> None:
        """Look at the saturation now and then, so that an idle scheduler stops being
        saturated though no batch asks."""
        self._watch = supervise_task(
            "scheduler-saturation", self._watch_saturation,
            what="the look at this scheduler's saturation (--defer-when-busy)",
            hint="Saturation is judged when batches come meanwhile.",
            on_restart=metrics.count_task_restart)

    async def close(self) -> None:
        """Stop looking."""
        if self._watch is not None:
            await cancel_and_wait(self._watch)
            self._watch = None

    async def _watch_saturation(self) -> None:
        while True:
            self.saturation.saturated()
            await asyncio.sleep(WATCH_EVERY_S)

    def _park_queued(self) -> None:
        """Saturation began: take the queued chunks of deferring bindings out of the queue
        and park them now, rather than when a worker reaches them (a chunk with a record
        whose deadline is near stays, and is judged when it leaves)."""
        now_ms = epoch_ms()
        for chunk in self.queue.remove_where(
                lambda c: may_wait(c.binding, c.items, now_ms)):
            self.answer(chunk, park(chunk.binding, chunk.items, now_ms)[0])

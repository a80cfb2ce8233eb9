"""The breaker gate (``--breaker``): park records while the binding's downstream fails.

A batch of a binding whose breaker is open or ramping is parked but for what the breaker
lets through; a chunk leaving the queue while it is open is parked but for its probes; each
chunk's outcomes are reported to it (:mod:`asynctier.scheduler.limits.breaker`).
"""

from __future__ import annotations

from collections.abc import Sequence

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.gates.base import Admitted, Gate, GateContext
from asynctier.scheduler.limits.breaker import Breakers


class BreakerGate(Gate):
    """Asks the bindings' circuit breakers."""

    def __init__(self, breakers: Breakers) -> None:
        self.breakers = breakers

    @classmethod
    def build(cls, ctx: GateContext) -> BreakerGate | None:
        """Only when the scheduler has breakers (else ``--breaker`` is not enforced)."""
        return None if ctx.breakers is None else cls(ctx.breakers)

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        """(parked, let through) for a batch."""
        return await self.breakers.admit(binding, items)

    def dequeue(self, binding: Binding, items: list[Item]) -> Admitted:
        """While the breaker is open, only the probes of a chunk run."""
        breakers = self.breakers
        if not breakers.parks_now(binding):
            return [], items
        parked = breakers.park(binding, [i for i in items if not breakers.is_probe(i)])
        return parked, [i for i in items if breakers.is_probe(i)]

    async def after_run(self, binding: Binding, items: Sequence[Item],
                        outcomes: list[Outcome]) -> list[Outcome]:
        """Feed the breaker; a failed probe spends no attempt."""
        return await self.breakers.report(binding, items, outcomes)

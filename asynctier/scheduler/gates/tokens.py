"""The rate gate: a rate-limited binding's chunk waits for its tokens at intake.

Waiting here, in the caller's task, rather than in a worker means a throttled binding
cannot hold the workers other bindings need: its call simply takes longer.
"""

from __future__ import annotations

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item
from asynctier.scheduler.admission import Admission
from asynctier.scheduler.gates.base import Admitted, Gate, GateContext


class TokenGate(Gate):
    """Takes one token per item from the binding's bucket, per chunk (never per item)."""

    per_chunk = True

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    @classmethod
    def build(cls, ctx: GateContext) -> TokenGate:
        """On the scheduler's admission."""
        return cls(ctx.admission)

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        """Every item, once its tokens are taken."""
        await self.admission.take_tokens(binding, len(items))
        return [], items

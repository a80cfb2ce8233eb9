"""The quota gate: a tenant over its quota per minute or per day waits, spending nothing.

Asked per chunk after the run-once claim (a record already done is never charged); the
items over quota get a ``retry`` after the seconds the quota says, spending no attempt.
"""

from __future__ import annotations

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, retry
from asynctier.scheduler.admission import Admission
from asynctier.scheduler.gates.base import Admitted, Gate, GateContext


class QuotaGate(Gate):
    """Charges the tenant for what fits; the rest comes back later."""

    per_chunk = True

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    @classmethod
    def build(cls, ctx: GateContext) -> QuotaGate:
        """On the scheduler's admission."""
        return cls(ctx.admission)

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        """(over-quota retries, items charged)."""
        over = await self.admission.over_quota(binding, items)
        if not over:
            return [], items
        refused = [retry(i["id"], f"tenant {binding.tenant} is over its quota",
                         after_s=over[i["id"]], spends_attempt=False)
                   for i in items if i["id"] in over]
        return refused, [i for i in items if i["id"] not in over]

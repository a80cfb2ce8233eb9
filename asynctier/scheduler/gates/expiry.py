"""The expiry gate (``--expire-after``): a record too old to be worth running never runs.

Asked when its batch arrives and again when its chunk leaves the queue, since a record can
expire while it waits (:mod:`asynctier.scheduler.deadlines`).
"""

from __future__ import annotations

from asynctier.platform.binding import Binding
from asynctier.platform.durations import epoch_ms
from asynctier.platform.wire import Item
from asynctier.scheduler.deadlines import split_expired
from asynctier.scheduler.gates.base import Admitted, Gate, GateContext


class ExpiryGate(Gate):
    """Answers ``failed`` (reason ``expired``) the records past their expiry."""

    @classmethod
    def build(cls, ctx: GateContext) -> ExpiryGate:
        """Every scheduler has one (a binding without ``--expire-after`` passes through)."""
        return cls()

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        """The batch's expired records are answered at once."""
        return split_expired(binding, items, epoch_ms())

    def dequeue(self, binding: Binding, items: list[Item]) -> Admitted:
        """What expired while queued is answered, not run."""
        return split_expired(binding, items, epoch_ms())

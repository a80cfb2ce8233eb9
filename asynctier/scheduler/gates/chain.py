"""The gates of one scheduler, in their order, asked as one (:class:`Gates`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from asynctier.platform import tracing
from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.bounded import Chunk
from asynctier.scheduler.gates.base import Admitted, Gate, GateContext, GateFactory
from asynctier.scheduler.gates.order import GATES, build_gates

#: A binding's concurrency now and the gate that holds its slots (None: not capped).
Capping = tuple[int, Gate] | None


class Gates:
    """Asks each gate in order; a gate is not asked once nothing is left to admit."""

    def __init__(self, ctx: GateContext, order: Sequence[GateFactory] = GATES) -> None:
        self.all = build_gates(ctx, order)
        self._batch = [g for g in self.all if not g.per_chunk]
        self._chunk = [g for g in self.all if g.per_chunk]

    async def admit_batch(self, binding: Binding, items: list[Item]) -> Admitted:
        """The per-batch gates' answer, before the run-once claim."""
        return await _admit(self._batch, binding, items)

    async def admit_chunk(self, binding: Binding, items: list[Item]) -> Admitted:
        """The per-chunk gates' answer, after it (a gate's error propagates)."""
        return await _admit(self._chunk, binding, items)

    async def enqueue(self, chunk: Chunk) -> None:
        """``chunk`` is about to be queued."""
        for gate in self.all:
            await gate.enqueue(chunk)

    def dequeue(self, binding: Binding, items: list[Item]) -> Admitted:
        """(refused, items to run) of a chunk leaving the queue."""
        refused: list[Outcome] = []
        for gate in self.all:
            if not items:
                break
            out, items = gate.dequeue(binding, items)
            refused += out
        return refused, items

    def capping(self, binding: Binding) -> Capping:
        """The first gate that caps ``binding`` now, with its lanes (None: none does)."""
        for gate in self.all:
            lanes = gate.lanes(binding)
            if lanes:
                return lanes, gate
        return None

    async def after_run(self, binding: Binding, items: Sequence[Item],
                        outcomes: list[Outcome]) -> list[Outcome]:
        """A chunk's outcomes through every gate."""
        for gate in self.all:
            outcomes = await gate.after_run(binding, items, outcomes)
        return outcomes

    def start(self) -> None:
        """Start every gate."""
        for gate in self.all:
            gate.start()

    async def close(self) -> None:
        """Close every gate."""
        for gate in self.all:
            await gate.close()


async def _admit(gates: list[Gate], binding: Binding, items: list[Item]) -> Admitted:
    refused: list[Outcome] = []
    for gate in gates:
        if not items:
            break
        began = time.monotonic()
        out, items = await gate.admit(binding, items)
        refused += out
        if tracing.enabled():
            from asynctier.scheduler.traces import note_wait  # OpenTelemetry: only while on

            note_wait(items, f"waited at {type(gate).__name__}", time.monotonic() - began)
    return refused, items

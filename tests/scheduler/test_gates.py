"""Admission as an ordered list of gates: a new gate is one class and one line in the order.

``Refusing`` is a throwaway gate (it refuses the items whose payload asks for it); inserted
into :data:`GATES`, a real Scheduler asks it, and the gates after it never see what it
refused.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.wire import REJECTED, Item, Outcome, failed
from asynctier.scheduler.admission import OpenAdmission
from asynctier.scheduler.bounded import BoundedQueue
from asynctier.scheduler.gates import GATES, Admitted, Gate, GateContext, build_gates
from asynctier.scheduler.gates.cap import CapGate
from asynctier.scheduler.gates.deferral import DeferralGate
from asynctier.scheduler.gates.expiry import ExpiryGate
from asynctier.scheduler.gates.quota import QuotaGate
from asynctier.scheduler.gates.tokens import TokenGate
from asynctier.scheduler.options import SchedulerOptions
from asynctier.scheduler.queues import FairQueue
from tests.scheduler_harness import by_id, item, local_scheduler


class Refusing(Gate):
    """Refuses, at intake, the items whose payload says ``{"refuse": true}``."""

    seen: list[int] = []

    @classmethod
    def build(cls, ctx: GateContext) -> Refusing:
        return cls()

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        Refusing.seen += [i["id"] for i in items]
        refuse = [i for i in items if json.loads(i["payload"] or b"{}").get("refuse")]
        return ([failed(i["id"], "refused by the test gate", REJECTED) for i in refuse],
                [i for i in items if i not in refuse])


class Counting(Gate):
    """A per-chunk gate after it: counts what it is asked about."""

    per_chunk = True
    seen: list[int] = []

    @classmethod
    def build(cls, ctx: GateContext) -> Counting:
        return cls()

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        Counting.seen += [i["id"] for i in items]
        return [], items


def test_a_new_gate_is_one_class_and_one_line_in_the_order() -> None:
    order = (*GATES[:1], Refusing.build, *GATES[1:], Counting.build)
    binding = Binding("b", Source("kafka", "t"), "tests.funcs.basic:noop")
    batch = [item("b", n, json.dumps({"refuse": n % 3 == 0}).encode()) for n in range(12)]

    async def scenario() -> dict[int, Outcome]:
        scheduler = local_scheduler([binding], gates=order)
        scheduler.start()
        try:
            return by_id(await scheduler.process(batch))
        finally:
            await scheduler.stop()

    outcomes = asyncio.run(scenario())
    refused = {n for n in range(12) if n % 3 == 0}
    for n, outcome in outcomes.items():
        if n in refused:
            assert outcome["status"] == "failed" and outcome["reason"] == REJECTED
            assert outcome["error"] == "refused by the test gate"
        else:
            assert outcome["status"] == "ok"
    assert sorted(Refusing.seen) == list(range(12))
    assert sorted(Counting.seen) == sorted(set(range(12)) - refused)


def _context() -> GateContext:
    queue = BoundedQueue(FairQueue(8, {"normal": 1.0}, {}), 100)
    return GateContext(OpenAdmission(), None, queue, SchedulerOptions(),
                       lambda chunk, outcomes: None)


def test_the_order_is_the_one_written_and_a_batch_gate_cannot_follow_a_chunk_gate() -> None:
    gates = build_gates(_context())  # no breakers: no breaker gate
    assert [type(g) for g in gates] == [ExpiryGate, DeferralGate, QuotaGate, TokenGate,
                                        CapGate]
    with pytest.raises(ValueError, match="Refusing is asked per batch"):
        build_gates(_context(), (*GATES, Refusing.build))

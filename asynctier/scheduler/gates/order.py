"""The order in which the gates are asked: written here, and only here.

A batch meets the gates that are not ``per_chunk`` first (expiry, deferral, breaker:
cheap, and they keep refused records from being claimed), then the run-once claim, then
per chunk the others (quota before tokens, so an item over quota takes no token; the cap
last, as it only waits). A chunk leaving the queue meets them again in the same order.
A new gate is one module and one line here.
"""

from __future__ import annotations

from collections.abc import Sequence

from asynctier.scheduler.gates.base import Gate, GateContext, GateFactory
from asynctier.scheduler.gates.breaker import BreakerGate
from asynctier.scheduler.gates.cap import CapGate
from asynctier.scheduler.gates.deferral import DeferralGate
from asynctier.scheduler.gates.expiry import ExpiryGate
from asynctier.scheduler.gates.quota import QuotaGate
from asynctier.scheduler.gates.tokens import TokenGate

GATES: tuple[GateFactory, ...] = (
    ExpiryGate.build,
    DeferralGate.build,
    BreakerGate.build,
    QuotaGate.build,
    TokenGate.build,
    CapGate.build,
)


def build_gates(ctx: GateContext, order: Sequence[GateFactory] = GATES) -> list[Gate]:
    """The gates of ``order`` that this scheduler uses; ValueError when a per-batch gate
    comes after a per-chunk one (the run-once claim sits between the two)."""
    gates = [gate for make in order if (gate := make(ctx)) is not None]
    seen_chunk = False
    for gate in gates:
        if gate.per_chunk:
            seen_chunk = True
        elif seen_chunk:
            raise ValueError(f"{type(gate).__name__} is asked per batch, before the claim: "
                             "it must come before every per-chunk gate")
    return gates

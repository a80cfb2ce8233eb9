"""The scheduler's fair queue, as pure logic (no asyncio, no clock).

Entries (chunks of items) are queued by priority tier and tenant. :class:`FairQueue`
picks the tier by stride scheduling with weights (``urgent:normal:batch = 8:4:1`` by
default): under contention urgent work starts first and gets 8 items for every 1 of
batch, yet no tier starves. Within a tier, :class:`TenantDRR` shares the work between
tenants by deficit round robin with a cost of one per item, so one tenant's flood does
not starve another's trickle; within a tenant, entries leave earliest deadline first
(EDF), in the order they came among equal deadlines (an entry pushed without a deadline
has an infinite one).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

TIERS: tuple[str, ...] = ("urgent", "normal", "batch")
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"urgent": 8.0, "normal": 4.0, "batch": 1.0}
#: The least and most tenant weight the queue honours (``asynctier tenant set``'s range).
MIN_WEIGHT, MAX_WEIGHT = 0.01, 1000.0


def _usable(weight: float) -> float:
    """``weight``, or 1 when it is outside MIN_WEIGHT..MAX_WEIGHT (NaN included)."""
    return weight if MIN_WEIGHT <= weight <= MAX_WEIGHT else 1.0


class TenantDRR(Generic[T]):
    """Deficit round robin across tenants; earliest deadline first within a tenant.

    Each turn a tenant gets ``quantum * weight`` credit and is served while the head
    entry's cost fits its credit. Weights default to 1; a weight that would give no credit
    (0, negative, NaN) or take a turn for ever (below :data:`MIN_WEIGHT`, inf) counts as
    1, so :meth:`pop` always ends. (Weights read from Redis are checked where read; this
    is the queue's own guard.)
    """

    def __init__(self, quantum: int, weights: Mapping[str, float] | None = None) -> None:
        if quantum < 1:
            raise ValueError("quantum must be at least 1")
        self.quantum = quantum
        self.weights = dict(weights or {})
        self._queues: dict[str, list[tuple[float, int, T, int]]] = {}
        self._seq = itertools.count()
        self._active: deque[str] = deque()
        self._deficit: dict[str, float] = {}
        self._granted = False
        self.items = 0

    def __len__(self) -> int:
        return len(self._active)

    def push(self, tenant: str, entry: T, cost: int, deadline: float = math.inf) -> None:
        """Queue ``entry`` (of ``cost`` items) among the tenant's entries by ``deadline``
        (any clock, the same for every entry), behind those of the same deadline."""
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = []
            self._active.append(tenant)
            self._deficit[tenant] = 0.0
        heapq.heappush(queue, (deadline, next(self._seq), entry, cost))
        self.items += cost

    def pop(self) -> tuple[str, T, int]:
        """The next entry as ``(tenant, entry, cost)``; IndexError when empty."""
        if not self._active:
            raise IndexError("pop from an empty queue")
        while True:
            tenant = self._active[0]
            queue = self._queues[tenant]
            cost = queue[0][3]
            if not self._granted:
                self._deficit[tenant] += self.quantum * _usable(self.weights.get(tenant, 1.0))
                self._granted = True
            if self._deficit[tenant] >= cost:
                return self._take(tenant, queue, cost)
            self._active.rotate(-1)
            self._granted = False

    def lone(self) -> list[str]:
        """The tenants with one entry queued, in the order of the round."""
        return [t for t in self._active if len(self._queues[t]) == 1]

    def take(self, tenant: str) -> tuple[str, T, int]:
        """``tenant``'s next entry out of turn, charged to its deficit; KeyError when it
        has none queued."""
        queue = self._queues[tenant]
        return self._take(tenant, queue, queue[0][3])

    def _take(self, tenant: str, queue: list[tuple[float, int, T, int]],
              cost: int) -> tuple[str, T, int]:
        entry = heapq.heappop(queue)[2]
        self._deficit[tenant] -= cost
        self.items -= cost
        if not queue:
            if self._active[0] == tenant:
                self._granted = False
            self._active.remove(tenant)
            del self._queues[tenant], self._deficit[tenant]
        return tenant, entry, cost

    def remove_where(self, pick: Callable[[T], bool]) -> list[tuple[str, T, int]]:
        """Take out every entry ``pick`` says, as ``(tenant, entry, cost)``; the others keep
        their order, and a tenant left with none leaves the round."""
        removed: list[tuple[str, T, int]] = []
        for tenant in list(self._queues):
            queue = self._queues[tenant]
            kept = [e for e in queue if not pick(e[2])]
            if len(kept) == len(queue):
                continue
            removed += [(tenant, e[2], e[3]) for e in queue if pick(e[2])]
            self.items -= sum(e[3] for e in queue) - sum(e[3] for e in kept)
            if kept:
                heapq.heapify(kept)
                self._queues[tenant] = kept
                continue
            if self._active and self._active[0] == tenant:
                self._granted = False
            self._active.remove(tenant)
            del self._queues[tenant], self._deficit[tenant]
        return removed

    def queued_by_tenant(self) -> dict[str, int]:
        """Queued items per tenant."""
        return {t: sum(e[3] for e in q) for t, q in self._queues.items()}


@dataclass
class _Tier(Generic[T]):
    name: str
    weight: float
    drr: TenantDRR[T]
    pass_: float = 0.0


class FairQueue(Generic[T]):
    """Priority tiers picked by stride scheduling, tenants within a tier by DRR."""

    def __init__(self, quantum: int = 256, tier_weights: Mapping[str, float] | None = None,
                 tenant_weights: Mapping[str, float] | None = None) -> None:
        weights = dict(DEFAULT_TIER_WEIGHTS)
        weights.update(tier_weights or {})
        for name, weight in weights.items():
            if weight <= 0:
                raise ValueError(f"tier {name}: weight must be positive")
        self._tiers: dict[str, _Tier[T]] = {
            name: _Tier(name, weights[name], TenantDRR(quantum, tenant_weights))
            for name in _ordered(weights)}
        self._ranks = {name: n for n, name in enumerate(self._tiers)}
        self._vtime = 0.0
        self.items = 0
        self.entries = 0
        self._by_tenant: dict[str, int] = {}
        self.started_by_tenant: dict[str, int] = {}  # items popped, for shared usage

    def set_tenant_weights(self, weights: Mapping[str, float]) -> None:
        """Share every tier between tenants by ``weights`` from now on (1 when not named)."""
        for tier in self._tiers.values():
            tier.drr.weights = dict(weights)

    def take_started(self) -> dict[str, int]:
        """Items popped per tenant since the last call (and reset)."""
        started, self.started_by_tenant = self.started_by_tenant, {}
        return started

    def __len__(self) -> int:
        return self.entries

    def push(self, tier: str, tenant: str, entry: T, cost: int,
             deadline: float = math.inf) -> None:
        """Queue ``entry`` of ``cost`` items for ``tenant`` in ``tier``, by ``deadline``
        within the tenant (earliest first)."""
        queue = self._tiers.get(tier)
        if queue is None:
            raise KeyError(f"unknown tier {tier!r}; tiers: {', '.join(self._tiers)}")
        if not queue.drr:  # waking up: no credit for the time it was idle
            queue.pass_ = max(queue.pass_, self._vtime)
        queue.drr.push(tenant, entry, cost, deadline)
        self.items += cost
        self.entries += 1
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + cost

    def pop(self) -> T:
        """The next entry; IndexError when empty."""
        return self.pop_with_tier()[1]

    def pop_with_tier(self) -> tuple[str, T]:
        """The next entry and its tier; IndexError when empty."""
        busy = [t for t in self._tiers.values() if t.drr]
        if not busy:
            raise IndexError("pop from an empty queue")
        tier = min(busy, key=lambda t: t.pass_)  # ties: the more urgent tier (dict order)
        self._vtime = tier.pass_
        tenant, entry, cost = tier.drr.pop()
        self._took(tier, tenant, cost)
        return tier.name, entry

    def pop_trickle(self, running: Mapping[tuple[str, str], int]) -> T | None:
        """The entry of a tenant that trickles in its tier: one entry queued there and
        nothing ``running`` (entries counted by ``(tier, tenant)``); the most urgent tier
        first, its tenants in round order, charged as if popped in turn. None when no
        tenant trickles (a backlog, even with nothing running, waits for its turn)."""
        for tier in self._tiers.values():
            for tenant in tier.drr.lone():
                if not running.get((tier.name, tenant)):
                    _, entry, cost = tier.drr.take(tenant)
                    self._took(tier, tenant, cost)
                    return entry
        return None

    def _took(self, tier: _Tier[T], tenant: str, cost: int) -> None:
        tier.pass_ += cost / tier.weight
        self.items -= cost
        self.entries -= 1
        self.started_by_tenant[tenant] = self.started_by_tenant.get(tenant, 0) + cost
        left = self._by_tenant[tenant] - cost
        if left:
            self._by_tenant[tenant] = left
        else:
            del self._by_tenant[tenant]

    def remove_where(self, pick: Callable[[T], bool]) -> list[T]:
        """Take out every entry ``pick`` says (from every tier); the others keep their
        order."""
        removed: list[T] = []
        for tier in self._tiers.values():
            for tenant, entry, cost in tier.drr.remove_where(pick):
                self.items -= cost
                self.entries -= 1
                left = self._by_tenant[tenant] - cost
                if left:
                    self._by_tenant[tenant] = left
                else:
                    del self._by_tenant[tenant]
                removed.append(entry)
        return removed

    def rank(self, tier: str) -> int:
        """The place of ``tier`` from the most urgent (0); KeyError when unknown."""
        return self._ranks[tier]

    def items_of_tenant(self, tenant: str) -> int:
        """Queued items of ``tenant`` over every tier."""
        return self._by_tenant.get(tenant, 0)

    def items_by_tier(self) -> dict[str, int]:
        """Queued items per tier."""
        return {name: t.drr.items for name, t in self._tiers.items()}


def _ordered(weights: Mapping[str, float]) -> Iterable[str]:
    known = [t for t in TIERS if t in weights]
    return known + sorted(set(weights) - set(TIERS))


def pick_waiter(waiting: Iterable[tuple[int, int, str]], queued: Mapping[str, int]) -> int:
    """Which caller waiting for room goes next: the most urgent tier's, then the one whose
    tenant has the fewest items queued, the earliest first among equals. ``waiting`` is
    ``(sequence, tier rank, tenant)`` triples (rank 0 the most urgent); the sequence of
    the chosen one is returned."""
    return min(waiting, key=lambda w: (w[1], queued.get(w[2], 0), w[0]))[0]

"""The scheduler's bounded queue: the fair queue of :mod:`queues`, on asyncio, with room.

At most ``max_items`` items wait in it. A :meth:`BoundedQueue.put` that does not fit
waits (backpressure: the tailer's submit call takes longer and memory stays flat). The
room is not all everyone's: each tier below the most urgent leaves
:data:`RESERVED_SHARE` of it to the tiers above (normal may fill 90%, batch 80%), so
a flood of batch work can never hold the door shut on urgent work. When room frees, the
waiting chunk of the most urgent tier goes first, and within a tier the one whose tenant
has the fewest items queued, so a flooding tenant cannot hold the door shut on a
trickling one either. A chunk larger than the whole room is let in when the queue is
empty.

It also keeps count of the items queued of bindings that do not defer (*firm* work, not
``--defer-when-busy``), since when some have been waiting, and when a firm chunk last
left after waiting at least ``firm_wait_s`` (from its ``put`` to its ``get``, room and
worker both): :mod:`.deferral` reads whether the scheduler is busy from that.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.queues import FairQueue, pick_waiter

#: The share of the room each tier leaves to every tier more urgent than itself.
RESERVED_SHARE = 0.1


@dataclass(eq=False)
class Chunk:
    """Items of one binding queued together; ``future`` gets their outcomes."""

    binding: Binding
    items: list[Item]
    future: asyncio.Future[list[Outcome]]
    queued_at: float = field(default=0.0)
    deadline: float = math.inf  # epoch seconds: the fair queue orders a tenant's by it
    # ids of the items whose success was written down while the chunk still ran
    written: set[int] = field(default_factory=set)

    @property
    def cost(self) -> int:
        """Its cost in the fair queue: one per item."""
        return len(self.items)


class BoundedQueue:
    """A :class:`FairQueue` of chunks holding at most ``max_items`` items."""

    def __init__(self, fair: FairQueue[Chunk], max_items: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self.fair = fair
        self.max_items = max_items
        self.peak_items = 0
        self._waiting: dict[int, tuple[Chunk, asyncio.Future[None]]] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._trickle_wanted = asyncio.Event()  # set on every push: get_trickle looks again
        self._seq = itertools.count()
        self.clock = clock  # seconds, monotonic: when firm work came and left (tests move it)
        self.firm_items = 0  # items queued of bindings without --defer-when-busy
        self.firm_since: float | None = None  # monotonic: since when some have waited
        self.firm_wait_s = math.inf  # a firm chunk that waited this long ...
        self.firm_waited_at = -math.inf  # ... last left the queue then

    @property
    def items(self) -> int:
        """Items queued now."""
        return self.fair.items

    @property
    def waiting_puts(self) -> int:
        """Chunks waiting for room."""
        return len(self._waiting)

    async def put(self, chunk: Chunk) -> None:
        """Queue ``chunk``, waiting for room when the queue is full."""
        chunk.queued_at = self.clock()
        if not self._waiting and self._fits(chunk):
            self._push(chunk)
            return
        seq = next(self._seq)
        admitted = asyncio.get_running_loop().create_future()
        self._waiting[seq] = (chunk, admitted)
        self._admit_waiting()  # it may go before those waiting (a more urgent tier)
        try:
            await admitted
        finally:
            self._waiting.pop(seq, None)

    async def get(self) -> Chunk:
        """The next chunk by tier and tenant; waits while the queue is empty."""
        while not self.fair:
            woken = asyncio.get_running_loop().create_future()
            self._getters.append(woken)
            try:
                await woken
            finally:
                if woken in self._getters:
                    self._getters.remove(woken)
        return self._left(self.fair.pop())

    async def get_trickle(self, running: Mapping[tuple[str, str], int]) -> Chunk:
        """The chunk of a tenant that trickles in its tier (:meth:`FairQueue.pop_trickle`,
        chunks ``running`` counted by ``(tier, tenant)``); waits until there is one.
        :meth:`wake_trickle` says that a count fell to none."""
        while (chunk := self.fair.pop_trickle(running)) is None:
            self._trickle_wanted.clear()
            await self._trickle_wanted.wait()
        return self._left(chunk)

    def wake_trickle(self) -> None:
        """Look again for a chunk for :meth:`get_trickle` (a tenant's work ended)."""
        self._trickle_wanted.set()

    def _left(self, chunk: Chunk) -> Chunk:
        """``chunk`` was taken out to run."""
        if not chunk.binding.deadlines.defer_when_busy:
            now = self.clock()
            if now - chunk.queued_at >= self.firm_wait_s:
                self.firm_waited_at = now
            self._firm_left(chunk.cost)
        self._admit_waiting()
        return chunk

    def remove_where(self, pick: Callable[[Chunk], bool]) -> list[Chunk]:
        """Take out the queued chunks ``pick`` says (chunks waiting for room are left);
        the room they held goes to the chunks waiting for it."""
        removed = self.fair.remove_where(pick)
        firm = sum(c.cost for c in removed if not c.binding.deadlines.defer_when_busy)
        if firm:
            self._firm_left(firm)
        if removed:
            self._admit_waiting()
        return removed

    def _firm_left(self, cost: int) -> None:
        """``cost`` items of firm work left the queue."""
        self.firm_items -= cost
        if self.firm_items <= 0:
            self.firm_items, self.firm_since = 0, None

    def _fits(self, chunk: Chunk) -> bool:
        """True when ``chunk`` fits in the room its tier may fill."""
        room = self.max_items * (1.0 - RESERVED_SHARE * self.fair.rank(chunk.binding.priority))
        return self.fair.items == 0 or self.fair.items + chunk.cost <= room

    def _push(self, chunk: Chunk) -> None:
        self.fair.push(chunk.binding.priority, chunk.binding.tenant, chunk, chunk.cost,
                       chunk.deadline)
        self.peak_items = max(self.peak_items, self.fair.items)
        if not chunk.binding.deadlines.defer_when_busy:
            if self.firm_since is None:
                self.firm_since = self.clock()
            self.firm_items += chunk.cost
        self._trickle_wanted.set()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                break

    def _admit_waiting(self) -> None:
        while self._waiting:
            tenants = {chunk.binding.tenant for chunk, _ in self._waiting.values()}
            queued = {t: self.fair.items_of_tenant(t) for t in tenants}
            rank = self.fair.rank
            seq = pick_waiter(((s, rank(c.binding.priority), c.binding.tenant)
                               for s, (c, _) in self._waiting.items()), queued)
            chunk, admitted = self._waiting[seq]
            if not self._fits(chunk):
                return
            del self._waiting[seq]
            if not admitted.done():  # a cancelled put leaves its chunk out
                self._push(chunk)
                admitted.set_result(None)

"""The run-once guard: a delivery guarantee, not an admission gate.

A gate decides whether an item may run now; the guard makes sure a record runs once
however often it is delivered. The dispatcher claims a batch's records with
:meth:`Guard.claim` before it queues them (a fresh record, :meth:`Guard.run_fresh`, runs
at once, the guard told beside its run), and after a chunk ran (or will not run here)
writes down how each ended with :meth:`Guard.finish`. :class:`OpenGuard` claims nothing
(every record runs); the Redis-backed guard is
:class:`~asynctier.scheduler.limits.redis_guard.RedisGuard`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, Outcome

#: Claim codes (one character per item, see :mod:`asynctier.scheduler.limits.once`).
RUN = "0"
DONE = "1"
BUSY = "2"
TAKEN_OVER = "3"


class Guard(Protocol):
    """What the dispatcher needs to run each record once."""

    async def claim(self, binding: Binding, items: Sequence[Item]) -> str:
        """One code per item: :data:`RUN` or :data:`TAKEN_OVER` (claimed: run it),
        :data:`DONE` (succeeded before: do not run) or :data:`BUSY` (running elsewhere)."""
        ...

    async def finish(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """Claimed ``items`` ran (or will not run here): keep their successes, free the rest.
        Returns the ids of those that did not succeed here but are done by another copy
        (their outcome becomes ``ok``)."""
        ...

    def holds(self, binding: Binding) -> bool:
        """Whether no other scheduler can have taken this one's records of ``binding``
        over now: a failure here then stands as it is (no copy can have succeeded
        meanwhile), and may be answered before its write-down."""
        ...

    def run_fresh(self, binding: Binding, items: Sequence[Item]
                  ) -> tuple[list[Item], Coroutine[Any, Any, None] | None]:
        """Take fresh ``items`` (no copy was sent before) as running here without waiting
        for Redis: the ones to claim all the same (see :meth:`claim`), and a write to make
        beside the run that :meth:`finish` must not overtake (or None)."""
        ...

    async def close(self) -> None:
        """Give back what is held (claims, connections)."""
        ...


class OpenGuard:
    """Claims nothing: every record runs, nothing is remembered."""

    async def claim(self, binding: Binding, items: Sequence[Item]) -> str:
        """Everything runs."""
        return RUN * len(items)

    async def finish(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """Nothing to remember."""
        return set()

    def holds(self, binding: Binding) -> bool:
        """Nothing is taken over."""
        return True

    def run_fresh(self, binding: Binding, items: Sequence[Item]
                  ) -> tuple[list[Item], Coroutine[Any, Any, None] | None]:
        """Nothing to claim, nothing to write."""
        return [], None

    async def close(self) -> None:
        """Nothing to give back."""

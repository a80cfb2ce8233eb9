"""The contract between the scheduler's dispatcher and the controls that admit work.

The dispatcher asks, per chunk of items of one binding (never per item):

0. :meth:`Admission.claim` - claims a batch's records so that a record that already
   succeeded is not run again (``ok`` without running) and one running elsewhere waits;
   :meth:`Admission.finish` marks a chunk's successes and releases the rest.
1. :meth:`Admission.over_quota` - which items are over their tenant's quota; those get a
   ``retry`` outcome that spends no attempt, after the seconds returned.
2. :meth:`Admission.take_tokens` - waits until ``n`` items may start under the binding's
   rate limit (one Redis round trip per call, not per item).
3. :meth:`Admission.slot` - holds one of the binding's concurrency slots (a Redis lease that
   expires when its holder dies, plus a local cap) while the chunk runs one item at a time.
4. :meth:`Admission.report` - successes and failures, for adaptive downstream protection.

:class:`OpenAdmission` admits everything at once; the Redis-backed implementation lives in
:mod:`asynctier.scheduler.limits`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, Outcome

#: Claim codes (one character per item, see :mod:`asynctier.scheduler.limits.once`).
RUN = "0"
DONE = "1"
BUSY = "2"
TAKEN_OVER = "3"


class Admission(Protocol):
    """What the dispatcher needs from rate limits, quotas and concurrency caps."""

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

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Item ids over quota, each with the seconds until it may run."""
        ...

    async def take_tokens(self, binding: Binding, n: int) -> None:
        """Return once ``n`` items may start under the binding's rate limit."""
        ...

    def slot(self, binding: Binding) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one concurrency slot of ``binding`` for the duration of the block."""
        ...

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        """Feedback after a chunk ran: how many succeeded and how many failed."""
        ...

    async def close(self) -> None:
        """Release every lease and connection."""
        ...


class OpenAdmission:
    """Admits everything at once: no quota, no rate limit, no concurrency cap, no claims."""

    async def claim(self, binding: Binding, items: Sequence[Item]) -> str:
        """Everything runs."""
        return RUN * len(items)

    async def finish(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """Nothing to remember."""
        return set()

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Nothing is over quota."""
        return {}

    async def take_tokens(self, binding: Binding, n: int) -> None:
        """No rate limit."""

    @contextlib.asynccontextmanager
    async def slot(self, binding: Binding) -> AsyncIterator[None]:
        """No concurrency cap."""
        yield

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        """Ignored."""

    async def close(self) -> None:
        """Nothing to release."""

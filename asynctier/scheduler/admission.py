"""The contract between the scheduler's gates and the controls that admit work.

The gates of :mod:`asynctier.scheduler.gates` ask, per chunk of items of one binding (never
per item):

- :meth:`Admission.over_quota` - which items are over their tenant's quota; those get a
  ``retry`` outcome that spends no attempt, after the seconds returned;
- :meth:`Admission.take_tokens` - waits until ``n`` items may start under the binding's
  rate limit (one Redis round trip per call, not per item);
- :meth:`Admission.slot` - holds one of the binding's concurrency slots (a Redis lease that
  expires when its holder dies, plus a local cap) while a chunk runs one item at a time;
- :meth:`Admission.concurrency_limit` - the adaptive (AIMD) limit within the binding's cap;
- :meth:`Admission.report` - successes and failures, which feed that adaptive limit.

Running each record once is not admission: it is the guard's (:mod:`.guard`).
:class:`OpenAdmission` admits everything at once; the Redis-backed implementation lives in
:mod:`asynctier.scheduler.limits`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item


class Admission(Protocol):
    """What the gates need from rate limits, quotas and concurrency caps."""

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Item ids over quota, each with the seconds until it may run."""
        ...

    async def take_tokens(self, binding: Binding, n: int) -> None:
        """Return once ``n`` items may start under the binding's rate limit."""
        ...

    def slot(self, binding: Binding) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one concurrency slot of ``binding`` for the duration of the block."""
        ...

    def concurrency_limit(self, binding: Binding) -> int | None:
        """The adaptive limit of ``binding`` now (None: none; the cap alone applies)."""
        ...

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        """Feedback after a chunk ran: how many succeeded and how many failed."""
        ...

    async def close(self) -> None:
        """Release every lease and connection."""
        ...


class OpenAdmission:
    """Admits everything at once: no quota, no rate limit, no concurrency cap."""

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Nothing is over quota."""
        return {}

    async def take_tokens(self, binding: Binding, n: int) -> None:
        """No rate limit."""

    @contextlib.asynccontextmanager
    async def slot(self, binding: Binding) -> AsyncIterator[None]:
        """No concurrency cap."""
        yield

    def concurrency_limit(self, binding: Binding) -> int | None:
        """No adaptive limit."""
        return None

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        """Ignored."""

    async def close(self) -> None:
        """Nothing to release."""

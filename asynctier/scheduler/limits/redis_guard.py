"""The Redis-backed run-once :class:`~asynctier.scheduler.guard.Guard` (:mod:`.once`).

A binding marked ``idempotent`` runs everything unclaimed, and so does a ``fail_open``
binding while Redis is down; a ``fail_closed`` one waits for Redis. Writing down how a
chunk ended never waits: with Redis down, the claims are forgotten here and told apart
later.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any

from asynctier.platform.binding import Binding
from asynctier.platform.redis_client import REDIS_DOWN
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.guard import RUN
from asynctier.scheduler.limits.link import RedisLink
from asynctier.scheduler.limits.once import DEFAULT_DONE_TTL_S, RunOnce


class RedisGuard:
    """Claims records in Redis and remembers the ones that succeeded."""

    def __init__(self, link: RedisLink, done_ttl_s: float = DEFAULT_DONE_TTL_S) -> None:
        self.link = link
        self.once = RunOnce(link.client, link.names, done_ttl_s)
        self._closed = False

    @property
    def redis_down(self) -> bool:
        """True while Redis does not answer."""
        return self.link.outage.down

    async def claim(self, binding: Binding, items: Sequence[Item]) -> str:
        """Claim ``items`` for this scheduler: one code per item (see :mod:`.once`)."""
        if binding.execution.idempotent or not items:
            return RUN * len(items)
        return await self.link.guarded(binding, lambda: self.once.claim(binding.name, items),
                                       lambda: RUN * len(items))

    async def finish(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """After claimed ``items`` ran (or will not run here): remember the successes,
        release the others; the ids of those another copy completed meanwhile. Redis being
        down costs only the memory of these successes."""
        if binding.execution.idempotent or not items:
            return set()
        link = self.link
        if not link.outage.may_try():  # not now: a claim left behind is told apart later
            self.once.forget(binding.name, items)
            link.stats.count_fallback(binding.name)
            return set()
        try:
            elsewhere = await self.once.finish(binding.name, items, outcomes)
        except REDIS_DOWN as exc:
            link.outage.failed(binding, exc)
            link.stats.count_fallback(binding.name)
            return set()
        link.outage.recovered()
        return elsewhere

    def holds(self, binding: Binding) -> bool:
        """Whether this scheduler's records of ``binding`` are surely its own (nothing of an
        idempotent binding is held; see :meth:`.once.RunOnce.holds`)."""
        return binding.execution.idempotent or self.once.holds(binding.name)

    def run_fresh(self, binding: Binding, items: Sequence[Item]
                  ) -> tuple[list[Item], Coroutine[Any, Any, None] | None]:
        """Fresh ``items`` run at once, in running ranges written beside their run; all are
        claimed first for a ``fail_closed`` binding (it must not run before its claim)
        and while Redis does not answer."""
        if binding.execution.idempotent:
            return [], None
        if binding.limits.redis_policy != "fail_open" or self.link.outage.down:
            return list(items), None
        others, write = self.once.run_fresh(binding.name, items)
        if write is None:
            return others, None
        return others, self.link.guarded(binding, write, lambda: None)

    async def close(self) -> None:
        """Drop this holder (its claims are free at once); once only."""
        if not self._closed:
            self._closed = True
            await self.once.close()

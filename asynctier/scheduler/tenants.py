"""Following tenants' weights live, and sharing what each tenant started, through Redis.

Every ``interval_s`` the :class:`TenantFollower` of a scheduler reads the weights
(``asynctier tenant set``) into its fair queue, so they apply within every tier of every
scheduler within a second, and adds the items each tenant started here to the shared
per-minute usage that ``asynctier tenant show`` reads.

Sharing across schedulers: the tailers spread every binding's batches over all live
schedulers, so each scheduler queues work of every backlogged tenant and serves it by the
same weights; the shares each scheduler gives add up to the same shares overall.

A weight in Redis that is no weight (``abc``, 0, -1, NaN, inf: :func:`~asynctier.platform.
limits.tenants.parse_weight`) is refused, logged once with the key and the fix, and the
tenant keeps the weight it had (its last good one, the configured one, or 1).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asynctier.platform import metrics
from asynctier.platform.redis_client import REDIS_DOWN
from asynctier.platform.supervise import supervise_task
from asynctier.scheduler.limits.tenants import TenantStore
from asynctier.scheduler.queues import MAX_WEIGHT, MIN_WEIGHT, FairQueue

log = logging.getLogger(__name__)


class TenantFollower:
    """Reads weights into ``fair`` and writes its started items out, every ``interval_s``."""

    def __init__(self, store: TenantStore, fair: FairQueue[Any], interval_s: float = 1.0,
                 base: dict[str, float] | None = None) -> None:
        self.store = store
        self.fair = fair
        self.interval_s = interval_s
        self.base = dict(base or {})  # weights of the scheduler's options, overridden
        self.weights: dict[str, float] = dict(self.base)
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._refused: dict[str, str] = {}  # tenant -> why, as last logged

    def start(self) -> None:
        """Follow on the running loop."""
        self._task = supervise_task(
            "tenant-weights", self._loop, what="the tenant weights follower",
            hint="The weights in force stay; check the tenant-weights hash in Redis.",
            on_restart=metrics.count_task_restart)

    async def stop(self) -> None:
        """Stop following (what was started since the last turn is written first)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.turn()
        await self.store.close()

    async def _loop(self) -> None:
        while True:
            try:
                await self.turn()
            except Exception:  # an unforeseen error must not end the following for good
                log.exception("tenant weights: a turn of the follower failed; the scheduler "
                              "keeps the weights it has (%s) and tries again in %gs",
                              self.weights or "all 1", self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def turn(self) -> None:
        """One read of the weights and one write of the usage."""
        started = self.fair.take_started()
        try:
            read = await self.store.weights()
            await self.store.add_usage(started)
        except REDIS_DOWN as exc:
            if not self._failing:
                log.warning("tenant weights cannot be read from Redis (%s); the scheduler "
                            "keeps the ones it has: %s", exc, self.weights or "all 1")
            self._failing = True
            return
        self._failing = False
        weights = {**self.base, **read.good}
        for tenant in read.refused:  # the weight it had stays in force
            if tenant in self.weights:
                weights[tenant] = self.weights[tenant]
            else:
                weights.pop(tenant, None)
        self._say_refused(read.refused, weights)
        if weights != self.weights:
            log.info("tenant weights now %s", weights or "all 1")
            self.weights = weights
            self.fair.set_tenant_weights(weights)

    def _say_refused(self, refused: dict[str, str], weights: dict[str, float]) -> None:
        """Log each refused weight once (again when it changes)."""
        for tenant, why in refused.items():
            if self._refused.get(tenant) == why:
                continue
            log.error("tenant %s: its weight in Redis (hash %s, field %s) is refused: %s. The "
                      "scheduler keeps weight %g for it. Fix it with `asynctier tenant set %s "
                      "--weight N` (N from %g to %g), or delete the field (HDEL) for the "
                      "default 1.", tenant, self.store.weights_key, tenant, why,
                      weights.get(tenant, 1.0), tenant, MIN_WEIGHT, MAX_WEIGHT)
        self._refused = dict(refused)

"""The Redis-backed :class:`~asynctier.scheduler.admission.Admission`.

Per chunk of items of one binding, each step is at most one Redis round trip:
``over_quota`` (quota and idempotency keys, one script), ``take_tokens`` (token bucket, one
script) and ``slot`` (a lease: one script to take it when free, one command to give it
back). Nothing is refused for being throttled: items wait, or are delayed without spending
an attempt when over quota. For a binding that is not ``idempotent``, ``claim`` and
``finish`` keep a record that succeeded from running again (:mod:`.once`: one script per
batch, one per chunk).

When Redis does not answer, each binding follows its ``redis_policy``: ``fail_open`` (the
default) admits through this scheduler's local limiter (:mod:`.local`) and counts it;
``fail_closed`` waits, retrying Redis with a growing backoff. Shared limits apply again as
soon as Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.redis_client import REDIS_DOWN, AsyncRedis, async_client
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.admission import RUN
from asynctier.scheduler.limits.aimd import Aimd, AimdConfig
from asynctier.scheduler.limits.bucket import RedisBucket
from asynctier.scheduler.limits.concurrency import DEFAULT_LEASE_S, LeasePool, LocalLimit
from asynctier.scheduler.limits.local import LocalLimiter
from asynctier.scheduler.limits.once import DEFAULT_DONE_TTL_S, RunOnce
from asynctier.scheduler.limits.outage import Backoff, Outage
from asynctier.scheduler.limits.quota import (
    DEFAULT_CHARGE_TTL_S,
    DEFAULT_RECHECK_S,
    QuotaStore,
    RedisQuota,
)
from asynctier.scheduler.limits.stats import AdmissionStats

T = TypeVar("T")


@dataclass(frozen=True)
class AdmissionConfig:
    """Tuning of :class:`RedisAdmission`; the defaults suit production."""

    lease_s: float = DEFAULT_LEASE_S
    charge_ttl_s: int = DEFAULT_CHARGE_TTL_S
    quota_recheck_s: float = DEFAULT_RECHECK_S
    socket_timeout_s: float = 1.0
    probe_interval_s: float = 1.0
    done_ttl_s: float = DEFAULT_DONE_TTL_S
    aimd: AimdConfig = field(default_factory=AimdConfig)


class _Local:
    """A binding's state in this scheduler: its adaptive limit and its local cap."""

    def __init__(self, binding: Binding, aimd: AimdConfig) -> None:
        self.cap = binding.max_concurrency
        self.aimd = Aimd(self.cap or aimd.uncapped_ceiling, aimd)
        self.limit = LocalLimit(self.cap)

    def update(self, binding: Binding, aimd: AimdConfig) -> None:
        if binding.max_concurrency != self.cap:
            self.cap = binding.max_concurrency
            self.aimd.resize(self.cap or aimd.uncapped_ceiling)
            self.apply()

    def apply(self) -> None:
        capped = self.cap is not None or not self.aimd.at_ceiling
        self.limit.resize(self.aimd.current if capped else None)


class RedisAdmission:
    """Rate limits, quotas and concurrency caps shared by every scheduler through Redis.

    Build one per scheduler process and :meth:`close` it when the process stops; the Redis
    client is created here (not at import) and connects on first use.
    """

    def __init__(self, settings: Settings, config: AdmissionConfig | None = None,
                 client: AsyncRedis | None = None) -> None:
        self.config = config or AdmissionConfig()
        self._own_client = client is None
        self._client = client or _client(settings.redis_url, self.config.socket_timeout_s)
        names = self._names = settings.names
        self._bucket = RedisBucket(self._client, names)
        self._quota = RedisQuota(self._client, names, self.config.charge_ttl_s,
                                 self.config.quota_recheck_s)
        self._leases = LeasePool(self._client, names, self.config.lease_s)
        self._once = RunOnce(self._client, names, self.config.done_ttl_s)
        self._fallback = LocalLimiter()
        self._outage = Outage(self.config.probe_interval_s)
        self._locals: dict[str, _Local] = {}
        self.stats = AdmissionStats()

    @property
    def quotas(self) -> QuotaStore:
        """The tenants' quotas, on this admission's Redis client."""
        return QuotaStore(self._client, self._names)

    @property
    def redis_down(self) -> bool:
        """True while Redis does not answer."""
        return self._outage.down

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Charge the tenant for what fits; ``{item id: seconds to wait}`` for the rest."""
        if not items:
            return {}
        over = await self._guarded(binding, lambda: self._quota.charge(binding, items),
                                   _nothing_over)
        if over:
            self.stats.count_quota_delayed(binding.name, binding.tenant, len(over))
        return over

    async def take_tokens(self, binding: Binding, n: int) -> None:
        """Return once ``n`` items may start under the binding's rate limit."""
        if binding.rate_per_s is None or n <= 0:
            return
        wait_s = await self._guarded(binding, lambda: self._bucket.reserve(binding, n),
                                     lambda: self._fallback.reserve(binding, n))
        if wait_s > 0:
            self.stats.count_throttled(binding.name, n)
            await asyncio.sleep(wait_s)

    @contextlib.asynccontextmanager
    async def slot(self, binding: Binding) -> AsyncIterator[None]:
        """Hold a local place and, for a capped binding, a global lease."""
        local = self._local(binding)
        waited = await local.limit.acquire()
        try:
            lease, lease_waited = await self._lease(binding)
            if waited or lease_waited:
                self.stats.count_concurrency_wait(binding.name)
            try:
                yield
            finally:
                if lease is not None:
                    await self._leases.release(binding.name, lease)
        finally:
            local.limit.release()

    async def claim(self, binding: Binding, items: Sequence[Item]) -> str:
        """Claim ``items`` for this scheduler: one code per item (see :mod:`.once`). A
        binding marked ``idempotent`` runs everything unclaimed, and so does a
        ``fail_open`` binding while Redis is down."""
        if binding.idempotent or not items:
            return RUN * len(items)
        return await self._guarded(binding, lambda: self._once.claim(binding.name, items),
                                   lambda: RUN * len(items))

    async def finish(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """After claimed ``items`` ran (or will not run here): remember the successes,
        release the others; the ids of those another copy completed meanwhile. Redis being
        down costs only the memory of these successes."""
        if binding.idempotent or not items:
            return set()
        if not self._outage.may_try():  # not now: a claim left behind is told apart later
            self._once.forget(binding.name, items)
            self.stats.count_fallback(binding.name)
            return set()
        try:
            elsewhere = await self._once.finish(binding.name, items, outcomes)
        except REDIS_DOWN as exc:
            self._outage.failed(binding, exc)
            self.stats.count_fallback(binding.name)
            return set()
        self._outage.recovered()
        return elsewhere

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        """Feed the binding's adaptive limit with a chunk's outcomes."""
        local = self._local(binding)
        local.aimd.record(ok, failed)
        local.apply()

    def concurrency_limit(self, binding: Binding) -> int | None:
        """This scheduler's current local limit of ``binding`` (None: no limit)."""
        return self._local(binding).limit.size

    async def close(self) -> None:
        """Give back every lease and close the Redis client (if it was created here)."""
        await self._leases.close()
        await self._once.close()
        if self._own_client:
            await self._client.aclose()

    def _local(self, binding: Binding) -> _Local:
        local = self._locals.get(binding.name)
        if local is None:
            local = self._locals[binding.name] = _Local(binding, self.config.aimd)
        else:
            local.update(binding, self.config.aimd)
        return local

    async def _lease(self, binding: Binding) -> tuple[str | None, bool]:
        if binding.max_concurrency is None:
            return None, False
        no_lease: tuple[str | None, bool] = (None, False)
        return await self._guarded(binding, lambda: self._leases.acquire(binding),
                                   lambda: no_lease)

    async def _guarded(self, binding: Binding, call: Callable[[], Awaitable[T]],
                       fallback: Callable[[], T]) -> T:
        """``call`` Redis; when it does not answer, follow the binding's policy."""
        backoff = Backoff()
        while True:
            if binding.redis_policy == "fail_closed" or self._outage.may_try():
                try:
                    value = await call()
                except REDIS_DOWN as exc:
                    self._outage.failed(binding, exc)
                else:
                    self._outage.recovered()
                    return value
            if binding.redis_policy == "fail_open":
                self.stats.count_fallback(binding.name)
                return fallback()
            await asyncio.sleep(backoff.next())


def _nothing_over() -> dict[int, float]:
    """Quotas are not enforced without Redis."""
    return {}


def _client(url: str, timeout_s: float) -> AsyncRedis:
    """A client that fails fast (one immediate retry, for a stale pooled connection)."""
    return async_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                        retry=Retry(NoBackoff(), 1))

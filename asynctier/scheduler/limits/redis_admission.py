"""The Redis-backed :class:`~asynctier.scheduler.admission.Admission`.

Per chunk of items of one binding: ``over_quota`` and ``take_tokens`` are one script
together on one Redis server (the quota charged and the tokens of what it admitted taken,
:data:`~.scripts.QUOTA_AND_TOKENS`), one each on a Redis Cluster (the quota's keys and the
bucket's live in different slots); ``slot`` is per item (a lease: one script to take it
when free, one command to give it back). Nothing is refused for being throttled: items
wait, or are delayed without spending an attempt when over quota. Its
:attr:`RedisAdmission.guard` (:mod:`.redis_guard`) keeps a record that succeeded from
running again, on the same client.

When Redis does not answer, each binding follows its ``redis_policy`` (:mod:`.link`):
``fail_open`` (the default) admits through this scheduler's local limiter (:mod:`.local`)
and counts it; ``fail_closed`` waits, retrying Redis with a growing backoff. Shared limits
apply again as soon as Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from redis.asyncio.cluster import RedisCluster

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.redis_client import AsyncRedis
from asynctier.platform.wire import Item
from asynctier.scheduler.limits.aimd import Aimd, AimdConfig
from asynctier.scheduler.limits.bucket import RedisBucket
from asynctier.scheduler.limits.concurrency import DEFAULT_LEASE_S, LeasePool, LocalLimit
from asynctier.scheduler.limits.link import RedisLink
from asynctier.scheduler.limits.local import LocalLimiter
from asynctier.scheduler.limits.once import DEFAULT_DONE_TTL_S
from asynctier.scheduler.limits.quota import (
    DEFAULT_CHARGE_TTL_S,
    DEFAULT_RECHECK_S,
    QuotaStore,
    RedisQuota,
)
from asynctier.scheduler.limits.redis_guard import RedisGuard
from asynctier.scheduler.limits.stats import AdmissionStats

#: How long a Redis call may take before Redis counts as down.
DEFAULT_SOCKET_TIMEOUT_S = 1.0
#: While Redis is down, it is tried again at most this often.
DEFAULT_PROBE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class AdmissionConfig:
    """Tuning of :class:`RedisAdmission` and its guard; the defaults suit production."""

    lease_s: float = DEFAULT_LEASE_S
    charge_ttl_s: int = DEFAULT_CHARGE_TTL_S
    quota_recheck_s: float = DEFAULT_RECHECK_S
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    done_ttl_s: float = DEFAULT_DONE_TTL_S
    aimd: AimdConfig = field(default_factory=AimdConfig)


class _Local:
    """A binding's state in this scheduler: its adaptive limit and its local cap."""

    def __init__(self, binding: Binding, aimd: AimdConfig) -> None:
        self.cap = binding.limits.max_concurrency
        self.aimd = Aimd(self.cap or aimd.uncapped_ceiling, aimd)
        self.limit = LocalLimit(self.cap)

    def update(self, binding: Binding, aimd: AimdConfig) -> None:
        if binding.limits.max_concurrency != self.cap:
            self.cap = binding.limits.max_concurrency
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
                 client: AsyncRedis | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        config = self.config = config or AdmissionConfig()
        names = self._names = settings.names
        self._link = (RedisLink.to(settings.redis_url, names, config.socket_timeout_s,
                                   config.probe_interval_s) if client is None else
                      RedisLink(client, names, config.probe_interval_s))
        self._client = self._link.client
        self._bucket = RedisBucket(self._client, names)
        # Quota and tokens in one call: only where every key lives on one server (the
        # quota's keys and the bucket's are in different slots of a Redis Cluster).
        self._one_server = not isinstance(self._client, RedisCluster)
        self._clock = clock  # epoch ms of the quota's windows (tests); Redis TIME when None
        self._quota = RedisQuota(self._client, names, config.charge_ttl_s,
                                 config.quota_recheck_s, clock=clock)
        self._leases = LeasePool(self._client, names, config.lease_s)
        self._fallback = LocalLimiter()
        self._locals: dict[str, _Local] = {}
        #: The run-once guard on this admission's client (pass it to the scheduler).
        self.guard = RedisGuard(self._link, config.done_ttl_s)

    @property
    def stats(self) -> AdmissionStats:
        """The admission's counters (its guard's fallbacks among them)."""
        return self._link.stats

    @property
    def quotas(self) -> QuotaStore:
        """The tenants' quotas, on this admission's Redis client."""
        return QuotaStore(self._client, self._names, self._clock)

    @property
    def redis_down(self) -> bool:
        """True while Redis does not answer."""
        return self._link.outage.down

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Charge the tenant for what fits; ``{item id: seconds to wait}`` for the rest."""
        if not items:
            return {}
        over = await self._link.guarded(binding, lambda: self._charge(binding, items),
                                        _nothing_over)
        if over:
            self.stats.count_quota_delayed(binding.name, binding.tenant, len(over))
        return over

    async def _charge(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Charge the quota; on one Redis server, take the tokens of a rate-limited
        binding's admitted items in the same call (its :meth:`take_tokens` then waits for
        them without a round trip)."""
        plan = None
        if (self._one_server and binding.limits.rate_per_s is not None
                and not self._quota.known_free(binding.tenant)):
            plan = self._bucket.plan(binding, len(items))
        if plan is None:
            return await self._quota.charge(binding, items)
        over, taken = await self._quota.charge_and_take(
            binding, items, self._bucket.key(binding.name), plan)
        if taken and len(items) > len(over):
            self._bucket.prepay(binding, len(items) - len(over), taken)
        return over

    async def take_tokens(self, binding: Binding, n: int) -> None:
        """Return once ``n`` items may start under the binding's rate limit."""
        if binding.limits.rate_per_s is None or n <= 0:
            return
        wait_s = await self._link.guarded(binding, lambda: self._bucket.reserve(binding, n),
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

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        """Feed the binding's adaptive limit with a chunk's outcomes."""
        local = self._local(binding)
        local.aimd.record(ok, failed)
        local.apply()

    def concurrency_limit(self, binding: Binding) -> int | None:
        """This scheduler's current local limit of ``binding`` (None: no limit)."""
        return self._local(binding).limit.size

    async def close(self) -> None:
        """Give back every lease, close the guard and the Redis client (if created here)."""
        await self._leases.close()
        await self.guard.close()
        await self._link.close()

    def _local(self, binding: Binding) -> _Local:
        local = self._locals.get(binding.name)
        if local is None:
            local = self._locals[binding.name] = _Local(binding, self.config.aimd)
        else:
            local.update(binding, self.config.aimd)
        return local

    async def _lease(self, binding: Binding) -> tuple[str | None, bool]:
        if binding.limits.max_concurrency is None:
            return None, False
        no_lease: tuple[str | None, bool] = (None, False)
        return await self._link.guarded(binding, lambda: self._leases.acquire(binding),
                                        lambda: no_lease)


def _nothing_over() -> dict[int, float]:
    """Quotas are not enforced without Redis."""
    return {}

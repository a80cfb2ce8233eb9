"""One scheduler's link to Redis, shared by its admission and its run-once guard: the
client, whether Redis answers (:mod:`.outage`), the counters, and what each binding does
when Redis does not answer (its ``redis_policy``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from asynctier.platform.binding import Binding
from asynctier.platform.names import Names
from asynctier.platform.redis_client import REDIS_DOWN, AsyncRedis, async_client
from asynctier.scheduler.limits.outage import Backoff, Outage
from asynctier.scheduler.limits.stats import AdmissionStats

T = TypeVar("T")


class RedisLink:
    """A Redis client (created here unless given) and the state of its outages."""

    def __init__(self, client: AsyncRedis, names: Names, probe_interval_s: float,
                 own_client: bool = False) -> None:
        self.client = client
        self.names = names
        self.own_client = own_client
        self.outage = Outage(probe_interval_s)
        self.stats = AdmissionStats()

    @classmethod
    def to(cls, url: str, names: Names, timeout_s: float,
           probe_interval_s: float) -> RedisLink:
        """A link on a new client of ``url`` that fails fast (one immediate retry, for a
        stale pooled connection)."""
        client = async_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                              retry=Retry(NoBackoff(), 1))
        return cls(client, names, probe_interval_s, own_client=True)

    async def guarded(self, binding: Binding, call: Callable[[], Awaitable[T]],
                      fallback: Callable[[], T]) -> T:
        """``call`` Redis; when it does not answer, follow the binding's policy:
        ``fail_open`` takes ``fallback()``, ``fail_closed`` waits and tries again."""
        backoff = Backoff()
        while True:
            if binding.limits.redis_policy == "fail_closed" or self.outage.may_try():
                try:
                    value = await call()
                except REDIS_DOWN as exc:
                    self.outage.failed(binding, exc)
                else:
                    self.outage.recovered()
                    return value
            if binding.limits.redis_policy == "fail_open":
                self.stats.count_fallback(binding.name)
                return fallback()
            await asyncio.sleep(backoff.next())

    async def close(self) -> None:
        """Close the client when it was created here."""
        if self.own_client:
            await self.client.aclose()

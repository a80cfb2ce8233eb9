"""Tenants' weights and the items they started, kept in Redis for every scheduler.

``asynctier tenant set NAME --weight N`` writes the weight to one Redis hash; each
scheduler reads it every second (:class:`~asynctier.platform.scheduler.tenants.
TenantFollower`) and shares its workers by it within every tier. Each scheduler also adds
the items it started per tenant to a per-minute counter here, so ``asynctier tenant
show`` gives each tenant's usage and share over all schedulers.
"""

from __future__ import annotations

from collections.abc import Mapping

from asynctier.platform.config import Settings
from asynctier.platform.names import Names
from asynctier.platform.redis_client import AsyncRedis, async_client

#: A per-minute usage counter lives this long (the current and the previous minute).
USAGE_TTL_S = 180


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class TenantStore:
    """Weights (hash ``<prefix>:tenant-weights``) and usage per minute
    (``<prefix>:tenant-used:<minute>``, a hash of tenant -> items started)."""

    def __init__(self, client: AsyncRedis, names: Names, own_client: bool = False) -> None:
        self.client = client
        self.names = names
        self._own = own_client

    @classmethod
    def from_settings(cls, settings: Settings) -> TenantStore:
        """A store on a new client of ``settings.redis_url``."""
        client = async_client(settings.redis_url, socket_timeout=2.0,
                                socket_connect_timeout=2.0)
        return cls(client, settings.names, own_client=True)

    @property
    def weights_key(self) -> str:
        """The hash of every tenant's weight."""
        return self.names.redis_key("tenant-weights")

    def usage_key(self, minute: int) -> str:
        """The hash of items started per tenant in ``minute`` (epoch minutes)."""
        return self.names.redis_key("tenant-used", str(minute))

    async def set_weight(self, tenant: str, weight: float) -> None:
        """Set ``tenant``'s weight (a tenant without one weighs 1)."""
        await self.client.hset(self.weights_key, tenant, repr(float(weight)))

    async def weights(self) -> dict[str, float]:
        """Every weight set."""
        raw = await self.client.hgetall(self.weights_key)
        return {_text(k): float(_text(v)) for k, v in raw.items()}

    async def add_usage(self, started: Mapping[str, int]) -> None:
        """Add items started per tenant to the current minute (by Redis ``TIME``)."""
        if not started:
            return
        seconds, _ = await self.client.time()
        key = self.usage_key(int(seconds) // 60)
        async with self.client.pipeline(transaction=False) as pipe:
            for tenant, n in started.items():
                pipe.hincrby(key, tenant, n)
            pipe.expire(key, USAGE_TTL_S)
            await pipe.execute()

    async def usage(self) -> tuple[dict[str, int], dict[str, int]]:
        """Items started per tenant in (the current minute, the previous one)."""
        seconds, _ = await self.client.time()
        minute = int(seconds) // 60
        now, before = await self.client.hgetall(self.usage_key(minute)), \
            await self.client.hgetall(self.usage_key(minute - 1))
        return ({_text(k): int(v) for k, v in now.items()},
                {_text(k): int(v) for k, v in before.items()})

    async def close(self) -> None:
        """Close the Redis client when it was created here."""
        if self._own:
            await self.client.aclose()

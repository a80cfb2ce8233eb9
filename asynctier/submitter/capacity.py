"""A tenant's enqueue capacity: workloads per minute the Submitters accept, FOQS-style.

Kept in Redis under ``<prefix>:enqueue-capacity:<tenant>`` (workloads per minute; set by
``asynctier quota set TENANT --enqueue-per-minute N``) and shared by every Submitter
process: :meth:`EnqueueCapacity.take` is one round trip
(:data:`TAKE_ENQUEUE_CAPACITY`) per call. A tenant without a capacity has no
limit.
"""

from __future__ import annotations

from typing import Final

from asynctier.platform.names import Names
from asynctier.platform.redis_client import AsyncRedis
from asynctier.platform.scripts import lua

#: Take workloads of a tenant's enqueue capacity (``lua/take_enqueue_capacity.lua``).
TAKE_ENQUEUE_CAPACITY: Final = lua("take_enqueue_capacity")


class EnqueueCapacity:
    """Reads, sets and takes tenants' enqueue capacity."""

    def __init__(self, client: AsyncRedis, names: Names) -> None:
        self._client = client
        self._names = names
        self._take = client.register_script(TAKE_ENQUEUE_CAPACITY)

    def key(self, tenant: str) -> str:
        """The Redis key of a tenant's capacity (workloads per minute)."""
        return self._names.tenant_key(tenant, "enqueue-capacity")

    def used_key(self, tenant: str) -> str:
        """The Redis key of what a tenant used in the current minute."""
        return self._names.tenant_key(tenant, "enqueue-used")

    async def set(self, tenant: str, per_minute: int | None) -> None:
        """Set (or with None remove) a tenant's capacity."""
        if per_minute is None:
            await self._client.delete(self.key(tenant))
        else:
            await self._client.set(self.key(tenant), int(per_minute))

    async def get(self, tenant: str) -> int | None:
        """A tenant's capacity per minute, or None for no limit."""
        raw = await self._client.get(self.key(tenant))
        return None if raw is None else int(raw)

    async def take(self, tenant: str, n: int) -> tuple[int, int]:
        """Take up to ``n``: (granted, milliseconds until the window resets)."""
        if n <= 0:
            return 0, 0
        granted, reset_ms = await self._take(keys=[self.key(tenant), self.used_key(tenant)],
                                             args=[n])
        return int(granted), int(reset_ms)

"""A tenant's enqueue capacity: workloads per minute the Submitters accept, FOQS-style.

Kept in Redis under ``<prefix>:enqueue-capacity:<tenant>`` (workloads per minute; set by
``asynctier quota set TENANT --enqueue-per-minute N``) and shared by every Submitter
process: :meth:`EnqueueCapacity.take` is one round trip
(:data:`TAKE_ENQUEUE_CAPACITY`) per call. A tenant without a capacity has no
limit.

The window is the minute of Redis ``TIME``, so Submitters' clocks never matter; a test
passes a ``clock`` (epoch ms) instead. A capacity in Redis that is not a whole number >= 0
(anything may have written there) is refused where it is read: the Submitter accepts the
tenant's workloads without that limit and says so, once per bad value (fail open, as when
Redis is down), with the key and the command that fixes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from asynctier.platform.names import Names
from asynctier.platform.redis_client import AsyncRedis
from asynctier.platform.scripts import lua

#: Take workloads of a tenant's enqueue capacity (``lua/take_enqueue_capacity.lua``).
TAKE_ENQUEUE_CAPACITY: Final = lua("take_enqueue_capacity")

log = logging.getLogger(__name__)


def parse_capacity(raw: bytes | str) -> int:
    """A capacity as read from Redis; ValueError, saying what is wrong, when it is not a
    whole number of workloads per minute >= 0."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a whole number") from None
    if value < 0:
        raise ValueError(f"{value} is below 0")
    return value


class EnqueueCapacity:
    """Reads, sets and takes tenants' enqueue capacity."""

    def __init__(self, client: AsyncRedis, names: Names,
                 clock: Callable[[], int] | None = None) -> None:
        self._client = client
        self._names = names
        self._clock = clock
        self._take = client.register_script(TAKE_ENQUEUE_CAPACITY)
        self._said_bad: set[str] = set()  # tenants whose bad capacity was logged

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
        """A tenant's capacity per minute, or None for no limit; ValueError for a bad
        value in Redis."""
        raw = await self._client.get(self.key(tenant))
        return None if raw is None else parse_capacity(raw)

    async def take(self, tenant: str, n: int) -> tuple[int, int]:
        """Take up to ``n``: (granted, milliseconds until the window resets)."""
        if n <= 0:
            return 0, 0
        args = [n] if self._clock is None else [n, self._clock()]
        granted, reset_ms, bad = await self._take(
            keys=[self.key(tenant), self.used_key(tenant)], args=args)
        if int(bad):
            self._say_bad(tenant)
        else:
            self._said_bad.discard(tenant)
        return int(granted), int(reset_ms)

    def _say_bad(self, tenant: str) -> None:
        if tenant in self._said_bad:
            return
        self._said_bad.add(tenant)
        log.error("tenant %s: its enqueue capacity in Redis (key %s) is not a whole number "
                  ">= 0; its workloads are accepted without that limit until it is fixed "
                  "with `asynctier quota set %s --enqueue-per-minute N`", tenant,
                  self.key(tenant), tenant, extra={"tenant": tenant})

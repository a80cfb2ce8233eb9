"""Tenants' weights and the items they started, kept in Redis for every scheduler.

``asynctier tenant set NAME --weight N`` writes the weight to one Redis hash; each
scheduler reads it every second (:class:`~asynctier.scheduler.tenants.
TenantFollower`) and shares its workers by it within every tier. Each scheduler also adds
the items it started per tenant to a per-minute counter here, so ``asynctier tenant
show`` gives each tenant's usage and share over all schedulers.

What is read from Redis is checked where it is read: anything may have written there. A
weight that is not a number from :data:`MIN_WEIGHT` to :data:`MAX_WEIGHT` (the range
``asynctier tenant set`` takes) is refused, with why; a usage count that is not a whole
number counts as 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from asynctier.platform.config import Settings
from asynctier.platform.durations import MINUTE_S
from asynctier.platform.names import Names
from asynctier.platform.redis_client import AsyncRedis, async_client
from asynctier.scheduler.queues import MAX_WEIGHT, MIN_WEIGHT

#: A per-minute usage counter lives this long (the current and the previous minute).
USAGE_TTL_S = 180


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def parse_weight(raw: bytes | str) -> float:
    """A weight as read from Redis; ValueError, saying what is wrong, when it is not a
    number from :data:`MIN_WEIGHT` to :data:`MAX_WEIGHT` (``abc``, 0, -1, NaN, inf...)."""
    text = _text(raw)
    try:
        weight = float(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number") from None
    if not (math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
        raise ValueError(f"{text[:40]!r} is not from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    return weight


def _count(raw: bytes | str) -> int:
    """A usage count as read from Redis (0 when it is not a whole number)."""
    try:
        return max(0, int(_text(raw)))
    except ValueError:
        return 0


class Weights(NamedTuple):
    """The weights read: those that are good, and why each other one was refused."""

    good: dict[str, float]
    refused: dict[str, str]


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

    async def weights(self) -> Weights:
        """Every weight set, each checked (:func:`parse_weight`)."""
        good: dict[str, float] = {}
        refused: dict[str, str] = {}
        for key, value in (await self.client.hgetall(self.weights_key)).items():
            try:
                good[_text(key)] = parse_weight(value)
            except ValueError as exc:
                refused[_text(key)] = str(exc)
        return Weights(good, refused)

    async def add_usage(self, started: Mapping[str, int]) -> None:
        """Add items started per tenant to the current minute (by Redis ``TIME``)."""
        if not started:
            return
        seconds, _ = await self.client.time()
        key = self.usage_key(int(seconds) // MINUTE_S)
        async with self.client.pipeline(transaction=False) as pipe:
            for tenant, n in started.items():
                pipe.hincrby(key, tenant, n)
            pipe.expire(key, USAGE_TTL_S)
            await pipe.execute()

    async def usage(self) -> tuple[dict[str, int], dict[str, int]]:
        """Items started per tenant in (the current minute, the previous one)."""
        seconds, _ = await self.client.time()
        minute = int(seconds) // MINUTE_S
        now, before = await self.client.hgetall(self.usage_key(minute)), \
            await self.client.hgetall(self.usage_key(minute - 1))
        return ({_text(k): _count(v) for k, v in now.items()},
                {_text(k): _count(v) for k, v in before.items()})

    async def close(self) -> None:
        """Close the Redis client when it was created here."""
        if self._own:
            await self.client.aclose()

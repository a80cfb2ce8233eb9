"""Scheduler membership in Redis: who is alive, where, and how loaded.

Each scheduler beats every ``interval_s`` (about 1 s): its address goes into the sorted set
``<prefix>:schedulers`` scored by its expiry (Redis ``TIME`` + ``ttl_s``, about 5 s) and
its load (items queued or running) into the hash ``<prefix>:schedulers:load``. A
scheduler that stops beating (killed, hung, cut off) drops out within the TTL. Tailers read
the live ones with :class:`SchedulerDirectory`, which falls back to
``settings.schedulers`` when Redis cannot be reached or no scheduler is registered.

When Redis is down a scheduler keeps serving: it logs once, keeps trying, and logs again
when its beat gets through.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import redis

from asynctier.platform import metrics
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.limits.scripts import lua
from asynctier.platform.redis_client import async_client, sync_client
from asynctier.platform.rpc import SchedulerClient

log = logging.getLogger(__name__)

#: Register a scheduler and prune the expired ones (``lua/membership_heartbeat.lua``).
HEARTBEAT: Final = lua("membership_heartbeat")
#: The live schedulers and their loads (``lua/membership_live.lua``).
LIVE: Final = lua("membership_live")


def member_keys(settings: Settings) -> tuple[str, str]:
    """The Redis keys of membership: the members' sorted set and their loads' hash."""
    names = settings.names
    return names.redis_tagged_key("schedulers"), names.redis_tagged_key("schedulers", "load")


@dataclass(frozen=True)
class Member:
    """A live scheduler and its load (items queued or running)."""

    address: str
    load: int


def _members(reply: list[Any]) -> list[Member]:
    pairs = zip(reply[::2], reply[1::2], strict=True)
    return sorted((Member(_text(a), int(_text(n))) for a, n in pairs),
                  key=lambda m: m.address)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def live_members(settings: Settings, script: Any = None) -> list[Member]:
    """The live schedulers with their loads; ServiceError when Redis cannot answer.

    ``script`` is the :data:`LIVE` script registered on a client (one is made if None).
    """
    client = None
    if script is None:
        client = sync_client(settings.redis_url, socket_timeout=1.0,
                             socket_connect_timeout=1.0)
        script = client.register_script(LIVE)
    try:
        return _members(script(keys=list(member_keys(settings))))
    except redis.RedisError as exc:
        raise ServiceError(f"Redis at {settings.redis_url} did not answer: {exc}") from exc
    finally:
        if client is not None:
            client.close()


def live_schedulers(settings: Settings) -> list[str]:
    """Addresses of the live schedulers; ServiceError when Redis cannot answer."""
    return [m.address for m in live_members(settings)]


class SchedulerDirectory:
    """Live scheduler addresses for tailers, cached ``cache_s``; ``settings.schedulers``
    when Redis fails or none is registered. Pass :meth:`addresses` to SchedulerClient."""

    def __init__(self, settings: Settings, cache_s: float = 1.0) -> None:
        self.settings = settings
        self.cache_s = cache_s
        self._client = sync_client(settings.redis_url, socket_timeout=0.5,
                                   socket_connect_timeout=0.5)
        self._live = self._client.register_script(LIVE)
        self._cached: list[str] = list(settings.schedulers)
        self._until = 0.0
        self._failing = False
        self._lock = threading.Lock()

    def addresses(self) -> list[str]:
        """The live schedulers' addresses (never empty when any is configured)."""
        with self._lock:
            if time.monotonic() >= self._until:
                self._cached = self._read()
                self._until = time.monotonic() + self.cache_s
            return list(self._cached)

    def _read(self) -> list[str]:
        try:
            live = [m.address for m in live_members(self.settings, self._live)]
        except ServiceError as exc:
            if not self._failing:
                log.warning("scheduler membership unavailable (%s); using the configured "
                            "schedulers %s", exc, ", ".join(self.settings.schedulers))
            self._failing = True
            return list(self.settings.schedulers)
        if self._failing:
            log.info("scheduler membership is back: %d live scheduler(s)", len(live))
            self._failing = False
        return live or list(self.settings.schedulers)

    def close(self) -> None:
        """Close the Redis connection."""
        self._client.close()


class Heartbeat:
    """Keeps one scheduler's address registered while it runs (an asyncio task)."""

    def __init__(self, settings: Settings, address: str, load: Callable[[], int],
                 interval_s: float = 1.0, ttl_s: float = 5.0) -> None:
        self.settings = settings
        self.address = address
        self.load = load
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.keys = member_keys(settings)
        self._client = async_client(settings.redis_url, socket_timeout=1.0,
                                    socket_connect_timeout=1.0)
        self._script = self._client.register_script(HEARTBEAT)
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> bool:
        """Register once now; False (logged once per outage) when Redis fails."""
        try:
            await self._script(keys=list(self.keys),
                               args=[self.address, self.ttl_ms, self.load()])
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("scheduler %s: membership heartbeat failed (%s); serving on and "
                            "retrying every %gs", self.address, exc, self.interval_s)
            self._failing = True
            return False
        if self._failing:
            log.info("scheduler %s: membership heartbeat is back", self.address)
            self._failing = False
        return True

    def start(self) -> None:
        """Beat in the background on the running loop."""
        self._task = asyncio.create_task(self._run(), name="scheduler-heartbeat")

    async def _run(self) -> None:
        while True:
            if await self.beat():
                await self._count_live()
            await asyncio.sleep(self.interval_s)

    async def _count_live(self) -> None:
        """Export how many schedulers are alive (from this one's point of view)."""
        try:  # the heartbeat script has just dropped the expired members
            live = await self._client.zcard(self.keys[0])
        except redis.RedisError:
            return
        metrics.set_live_schedulers(int(live))

    async def stop(self, leave: bool = True) -> None:
        """Stop beating; with ``leave``, drop out of the membership at once."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if leave:
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.zrem(self.keys[0], self.address)
                    pipe.hdel(self.keys[1], self.address)
                    await pipe.execute()
            except redis.RedisError as exc:
                log.warning("scheduler %s: could not leave the membership: %s",
                            self.address, exc)
        await self._client.aclose()


def default_client(settings: Settings, wait_for_scheduler: bool = True) -> SchedulerClient:
    """A SchedulerClient on the live schedulers (Redis membership), falling back to the
    configured list: the delay path keeps working when Redis is down. Without
    ``wait_for_scheduler`` a call raises SchedulerUnavailable when none is known at all."""
    return SchedulerClient(SchedulerDirectory(settings).addresses,
                           wait_for_scheduler=wait_for_scheduler)

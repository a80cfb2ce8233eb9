"""A scheduler's heartbeat: keeps its address, load, region and capacity registered in the
membership (:mod:`asynctier.platform.membership`) while it runs.

When Redis is down a scheduler keeps serving: it logs once, keeps trying, and logs again
when its beat gets through.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

import redis

from asynctier.platform import metrics
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.config import REDIS_AUTH_HINT, Settings
from asynctier.platform.membership import member_keys, place_json
from asynctier.platform.redis_client import async_client
from asynctier.platform.scripts import lua
from asynctier.platform.supervise import supervise_task

log = logging.getLogger(__name__)

#: Register a scheduler and prune the expired ones (``lua/membership_heartbeat.lua``).
HEARTBEAT: Final = lua("membership_heartbeat")


class Heartbeat:
    """Keeps one scheduler's address registered while it runs (an asyncio task)."""

    def __init__(self, settings: Settings, address: str, load: Callable[[], int],
                 interval_s: float = 1.0, ttl_s: float = 5.0, capacity: int = 0,
                 tier: str | None = None) -> None:
        self.settings = settings
        self.address = address
        self.load = load
        self.place = place_json(settings.region, capacity, tier)
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.keys = member_keys(settings)
        self._client = async_client(settings.redis_url, socket_timeout=1.0,
                                    socket_connect_timeout=1.0)
        self._script = self._client.register_script(HEARTBEAT)
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self.redis_display = settings.redis_display
        #: Why the last beat failed ("" when it got through): the scheduler's readiness.
        self.error = ""

    async def beat(self) -> bool:
        """Register once now; False (logged once per outage) when Redis fails."""
        try:
            await self._script(keys=list(self.keys),
                               args=[self.address, self.ttl_ms, self.load(), self.place])
        except redis.RedisError as exc:
            self.error = f"Redis at {self.redis_display} did not answer: {exc}"
            if not self._failing:
                hint = (f"; {REDIS_AUTH_HINT}" if isinstance(exc, redis.AuthenticationError)
                        else "")
                log.warning("scheduler %s: membership heartbeat failed (%s); serving on and "
                            "retrying every %gs%s", self.address, exc, self.interval_s, hint)
            self._failing = True
            return False
        if self._failing:
            log.info("scheduler %s: membership heartbeat is back", self.address)
            self._failing = False
        self.error = ""
        return True

    def start(self) -> None:
        """Beat in the background on the running loop."""
        self._task = supervise_task(
            "scheduler-heartbeat", self._run, what=f"scheduler {self.address}: the "
            "membership heartbeat", hint="Tailers stop finding this scheduler once its "
            "registration expires; check Redis and the error above.",
            on_restart=metrics.count_task_restart)

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
                    pipe.hdel(self.keys[2], self.address)
                    await pipe.execute()
            except redis.RedisError as exc:
                log.warning("scheduler %s: could not leave the membership: %s",
                            self.address, exc)
        await self._client.aclose()

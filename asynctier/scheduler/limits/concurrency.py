"""Concurrency caps: a local limit per scheduler and leases in Redis shared by all of them.

:class:`LocalLimit` is an asyncio semaphore whose size may change while it is held (the
binding's cap, lowered by adaptive protection). :class:`LeasePool` holds a binding's global
slots as leases in Redis: members of a sorted set scored by their expiry
(:data:`~.scripts.ACQUIRE_LEASE`). While a lease is held a heartbeat renews it; when its
holder dies (SIGKILL, a lost host) the heartbeat stops and the slot comes back within one
lease time.

A scheduler waiting for a global slot polls with a growing backoff (5 ms to 100 ms), one
poller per binding per scheduler (the others queue behind it locally), and is woken at once
when it releases a slot of that binding itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import uuid
from collections import deque

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.names import Names
from asynctier.platform.redis_client import REDIS_DOWN, AsyncRedis
from asynctier.platform.supervise import RestartPolicy, supervise_task
from asynctier.scheduler.limits.bad_values import BadValues
from asynctier.scheduler.limits.quota import as_text
from asynctier.scheduler.limits.scripts import ACQUIRE_LEASE, RENEW_LEASES

log = logging.getLogger(__name__)

#: Lease time: long enough to ride over a slow heartbeat, short enough that a dead
#: holder's slots come back quickly. Renewed every third of it.
DEFAULT_LEASE_S = 6.0
POLL_FIRST_S = 0.005
POLL_MAX_S = 0.1
#: Each wait lasts a random share of the delay between these, so that waiters do not ask
#: Redis in step.
POLL_JITTER = (0.5, 1.0)


class LocalLimit:
    """A FIFO asyncio semaphore of ``size`` places (``None``: no limit) that can be resized."""

    def __init__(self, size: int | None) -> None:
        self.size = size
        self.held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _room(self) -> bool:
        return self.size is None or self.held < self.size

    async def acquire(self) -> bool:
        """Take a place; True when it had to wait for one."""
        if self._room() and not self._waiters:
            self.held += 1
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # it was handed a place just as it was cancelled
            else:
                self._waiters.remove(waiter)
            raise
        return True

    def release(self) -> None:
        """Give a place back."""
        self.held -= 1
        self._wake()

    def resize(self, size: int | None) -> None:
        """Take a new size; holders above it finish, newcomers wait."""
        self.size = size
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._room():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.held += 1
                waiter.set_result(None)


class LeasePool:
    """Leases of concurrency slots in Redis, global across schedulers, renewed while held."""

    def __init__(self, client: AsyncRedis, names: Names, lease_s: float = DEFAULT_LEASE_S,
                 policy: RestartPolicy | None = None) -> None:
        self._names = names
        self._policy = policy  # how the heartbeat restarts after a failure (tests shorten it)
        self._lease_ms = int(lease_s * 1000)
        self._acquire = client.register_script(ACQUIRE_LEASE)
        self._renew = client.register_script(RENEW_LEASES)
        self._client = client
        self._holder = uuid.uuid4().hex[:12]
        self._seq = itertools.count()
        self._held: dict[str, set[str]] = {}
        self._gates: dict[str, asyncio.Lock] = {}
        self._freed: dict[str, asyncio.Event] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._bad = BadValues(log)

    def key(self, binding: str) -> str:
        """The Redis key of a binding's leases."""
        return self._names.redis_key("leases", binding)

    def held(self, binding: str) -> int:
        """How many leases of ``binding`` this pool holds."""
        return len(self._held.get(binding, ()))

    async def acquire(self, binding: Binding) -> tuple[str, bool]:
        """Wait for a lease under the binding's cap; the lease id and whether it waited."""
        assert binding.limits.max_concurrency is not None
        lease = f"{self._holder}:{next(self._seq)}"
        gate = self._gates.setdefault(binding.name, asyncio.Lock())
        waited = gate.locked()
        async with gate:
            waited = await self._poll(binding, lease) or waited
        self._held.setdefault(binding.name, set()).add(lease)
        self._ensure_heartbeat()
        return lease, waited

    async def _poll(self, binding: Binding, lease: str) -> bool:
        freed = self._freed.setdefault(binding.name, asyncio.Event())
        delay, waited = POLL_FIRST_S, False
        cap = binding.limits.max_concurrency
        assert cap is not None
        args: list[int | str] = [cap, lease, self._lease_ms]
        while True:
            freed.clear()
            taken, refused = await self._acquire(keys=[self.key(binding.name)], args=args)
            if refused:
                self._refused(binding.name, as_text(refused))
            if int(taken):
                return waited
            waited = True
            with contextlib.suppress(TimeoutError):  # not wait_for: it can lose a cancel
                async with asyncio.timeout(delay * random.uniform(*POLL_JITTER)):
                    await freed.wait()
            delay = min(delay * 2, POLL_MAX_S)

    def _refused(self, binding: str, refused: str) -> None:
        """Say once each lease the script refused (dropped: it held its slot for ever)."""
        for lease in refused.split("\n"):
            name, _, expiry = lease.rpartition("=")
            self._bad.refused(self.key(binding), name, expiry, "an expiry no heartbeat "
                              "sets (it would hold its slot for ever); the lease was dropped",
                              "nothing to do", binding=binding)

    async def release(self, binding: str, lease: str) -> None:
        """Give a lease back (if Redis is down it expires by itself)."""
        self._held.get(binding, set()).discard(lease)
        if binding in self._freed:
            self._freed[binding].set()
        with contextlib.suppress(*REDIS_DOWN):
            await self._client.zrem(self.key(binding), lease)

    async def close(self) -> None:
        """Stop the heartbeat and give back every lease still held."""
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
            self._heartbeat = None
        for binding, leases in self._held.items():
            if leases:
                with contextlib.suppress(*REDIS_DOWN):
                    await self._client.zrem(self.key(binding), *leases)
        self._held.clear()

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = supervise_task(
                "asynctier-lease-heartbeat", self._beat, policy=self._policy,
                what="the concurrency leases' heartbeat",
                hint="Leases held here lapse meanwhile and their slots may be taken twice; "
                     "check Redis and the error above.", on_restart=metrics.count_task_restart)

    async def _beat(self) -> None:
        """The heartbeat's loop (supervised): renew the leases held, every third of the
        lease time."""
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            for binding, leases in list(self._held.items()):
                if leases:
                    await self._renew_binding(binding, leases)

    async def _renew_binding(self, binding: str, leases: set[str]) -> None:
        try:
            lost = await self._renew(keys=[self.key(binding)], args=[self._lease_ms, *leases])
        except REDIS_DOWN as exc:
            log.debug("could not renew leases of %s: %s", binding, exc)
            return
        for raw in lost:
            lease = raw.decode() if isinstance(raw, bytes) else str(raw)
            leases.discard(lease)
            log.warning("binding %s: concurrency lease %s expired while held (heartbeat "
                        "late); its slot may be taken twice until it ends", binding, lease,
                        extra={"binding": binding})

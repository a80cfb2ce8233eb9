"""Token buckets: a binding's rate (items per second) with a burst, handed out as reservations.

A take never fails and never polls: the tokens are taken at once, the bucket may go into
debt, and the caller sleeps for exactly the time the debt needs to refill. Callers are
thereby served first come, first served, and a take larger than the burst works in one
step.

:class:`TokenBucket` is the algorithm in memory (the per-scheduler fallback);
:class:`RedisBucket` runs the same algorithm in Redis (:data:`~.scripts.TAKE_TOKENS`), so
that every scheduler draws from one bucket per binding, one round trip per take.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from asynctier.platform.binding import Binding
from asynctier.platform.names import Names
from asynctier.platform.redis_client import AsyncRedis
from asynctier.scheduler.limits.bad_values import BadValues
from asynctier.scheduler.limits.quota import as_text
from asynctier.scheduler.limits.scripts import TAKE_TOKENS

log = logging.getLogger(__name__)


def burst_of(binding: Binding) -> float:
    """The binding's burst: its own, else one second's worth of its rate (at least 1)."""
    if binding.limits.burst is not None:
        return float(binding.limits.burst)
    return float(max(1, math.ceil(binding.limits.rate_per_s or 1.0)))


class TokenBucket:
    """A token bucket in memory: ``reserve(n)`` returns the seconds to wait (0: at once)."""

    def __init__(self, rate_per_s: float, burst: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._ts = clock()

    def reserve(self, n: int) -> float:
        """Take ``n`` tokens now; the seconds until they are all refilled (0 when they were
        there)."""
        now = self._clock()
        if now > self._ts:
            self._tokens = min(self.burst, self._tokens + (now - self._ts) * self.rate_per_s)
        self._ts = now
        self._tokens -= n
        return max(0.0, -self._tokens / self.rate_per_s)

    def reconfigure(self, rate_per_s: float, burst: float) -> None:
        """Take a new rate and burst (a binding changed); the tokens held are kept."""
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = min(self._tokens, burst)


#: Tokens taken with a chunk's quota wait for their take this many at most per binding
#: (those of a chunk that never came to take them are dropped: the rate is kept).
MAX_PREPAID = 256
#: A fast binding's scheduler takes this many seconds' worth of its rate ahead ...
SPARE_S = 0.05
#: ... when that is at least this many tokens (a slower binding pays a round trip per
#: take, which is then at most a few a second per batch size).
MIN_SPARE = 100


class RedisBucket:
    """One token bucket per binding in Redis, shared by every scheduler.

    For a fast binding (see :data:`SPARE_S`) a take also asks for spare tokens, granted
    only from what the bucket holds (never into debt); later takes are served from them,
    without a round trip, for up to :data:`SPARE_S`. Spare tokens left then are dropped:
    the shared rate is never exceeded, and a never-binding limit costs one round trip per
    ``SPARE_S`` instead of one per batch.
    """

    def __init__(self, client: AsyncRedis, names: Names,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._names = names
        self._take = client.register_script(TAKE_TOKENS)
        self._clock = clock
        self._spare: dict[str, tuple[int, float]] = {}  # binding: (tokens, usable until)
        self._bad = BadValues(log)
        # binding: (tokens, when they may be used), taken with its chunks' quota (prepay)
        self._prepaid: dict[str, deque[tuple[int, float]]] = {}

    def key(self, binding: str) -> str:
        """The bucket's Redis key."""
        return self._names.redis_key("rate", binding)

    async def reserve(self, binding: Binding, n: int) -> float:
        """Take ``n`` tokens of ``binding``'s bucket; the seconds to wait (0: at once)."""
        rate = binding.limits.rate_per_s
        assert rate is not None
        name, now = binding.name, self._clock()
        paid = self._prepaid.get(name)
        if paid:
            for entry in paid:
                if entry[0] == n:  # taken with the chunk's quota (see prepay)
                    paid.remove(entry)
                    return max(0.0, entry[1] - now)
        spare = self._spare.pop(name, None)
        if spare is not None and now < spare[1]:
            if spare[0] >= n:
                self._spare[name] = (spare[0] - n, spare[1])
                return 0.0
            n -= spare[0]
        wait_us, granted, refused = await self._take(keys=[self.key(name)],
                                                     args=[rate, burst_of(binding), n,
                                                           self._want(binding)])
        self._refused(name, as_text(refused))
        if int(granted) > 0:
            self._spare[name] = (int(granted), now + SPARE_S)
        return int(wait_us) / 1_000_000

    def plan(self, binding: Binding, n: int) -> list[float] | None:
        """What a take of up to ``n`` tokens asks the script (rate, burst, spare wanted),
        to be taken together with another script (:meth:`prepay`); None when this
        scheduler's spare tokens cover ``n`` (a take then costs no round trip)."""
        rate = binding.limits.rate_per_s
        assert rate is not None
        spare = self._spare.get(binding.name)
        if spare is not None and self._clock() < spare[1] and spare[0] >= n:
            return None
        return [rate, burst_of(binding), self._want(binding)]

    def prepay(self, binding: Binding, n: int, reply: list[Any]) -> None:
        """Keep the answer of ``n`` tokens taken with another script: the next
        :meth:`reserve` of ``n`` tokens of ``binding`` waits for them without a round
        trip."""
        wait_us, granted, refused = reply
        self._refused(binding.name, as_text(refused))
        now = self._clock()
        if int(granted) > 0:
            self._spare[binding.name] = (int(granted), now + SPARE_S)
        self._prepaid.setdefault(binding.name, deque(maxlen=MAX_PREPAID)).append(
            (n, now + int(wait_us) / 1_000_000))

    def _want(self, binding: Binding) -> int:
        """The spare tokens a take asks for (0 for a binding slower than
        :data:`MIN_SPARE` per :data:`SPARE_S`)."""
        want = int(min(burst_of(binding), (binding.limits.rate_per_s or 0.0) * SPARE_S))
        return want if want >= MIN_SPARE else 0

    def _refused(self, binding: str, refused: str) -> None:
        """Say once each value of the bucket the script refused (it filled the bucket
        afresh and wrote it anew)."""
        key = self.key(binding)
        if not refused:
            self._bad.good(key)
            return
        self._bad.refused(key, "", refused.replace("\n", ", "),
                          "not a token bucket's tokens or time; the bucket started full "
                          "again and was written anew", "nothing to do (or delete the key)",
                          binding=binding)

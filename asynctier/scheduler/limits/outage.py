"""Redis outages: what counts as one, how often to try again, and saying so once.

Under ``fail_open`` admission falls back to the local limiter and probes Redis again at most
every ``probe_interval_s``; under ``fail_closed`` it waits, retrying with a growing backoff.
Either way one loud line per binding per outage says what happens, and one line says when
Redis is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from asynctier.platform.binding import Binding

log = logging.getLogger(__name__)

class Outage:
    """Whether Redis answers, shared by every binding of one admission."""

    def __init__(self, probe_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = probe_interval_s
        self._clock = clock
        self._since: float | None = None
        self._next_probe = 0.0
        self._told: set[str] = set()

    @property
    def down(self) -> bool:
        """True from a failed call until a call succeeds."""
        return self._since is not None

    def may_try(self) -> bool:
        """True when Redis is up, or the next probe of a down Redis is due."""
        return self._since is None or self._clock() >= self._next_probe

    def failed(self, binding: Binding, exc: BaseException) -> None:
        """A call for ``binding`` failed: note it, and say so once per binding per outage."""
        now = self._clock()
        if self._since is None:
            self._since = now
        self._next_probe = now + self._interval
        if binding.name not in self._told:
            self._told.add(binding.name)
            log.error("REDIS UNREACHABLE (%s): binding %s %s", exc or type(exc).__name__,
                      binding.name, _consequence(binding), extra={"binding": binding.name})

    def recovered(self) -> None:
        """A call succeeded: the outage, if any, is over."""
        if self._since is None:
            return
        log.warning("Redis answers again after %.1f s: shared limits apply again to %s",
                    self._clock() - self._since, ", ".join(sorted(self._told)))
        self._since = None
        self._told.clear()


class Backoff:
    """Growing waits between retries: ``first``, doubling, at most ``cap`` seconds."""

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self._next = first
        self._cap = cap

    def next(self) -> float:
        """The next wait."""
        wait = self._next
        self._next = min(self._next * 2, self._cap)
        return wait


def _consequence(binding: Binding) -> str:
    if binding.limits.redis_policy == "fail_closed":
        return "is fail_closed: its admission is PAUSED until Redis answers again"
    return ("fails open to this scheduler's local limiter (rate per scheduler, local "
            "concurrency cap, quotas NOT enforced) until Redis answers again")

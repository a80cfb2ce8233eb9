"""A topic's backlog, read at most once per ``recheck_s``: ready and delayed items of a
queue topic, or the consumer lag of a Kafka binding's group."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.lag import LagReader, binding_targets

log = logging.getLogger(__name__)


class Backlog:
    """Says whether a binding's topic is over ``cap``; readings are reused for
    ``recheck_s``. A reading that fails lets work through (and is logged)."""

    def __init__(self, settings: Settings, queue: Any, cap: int, recheck_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.queue = queue
        self.cap = cap
        self.recheck_s = recheck_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}
        self._lag: LagReader | None = None

    async def over_cap(self, binding: Binding) -> int | None:
        """The backlog when it is over the cap, else None."""
        now = self._clock()
        seen = self._seen.get(binding.name)
        if seen is None or now - seen[0] >= self.recheck_s:
            try:
                size = await asyncio.to_thread(self._read, binding)
            except Exception as exc:
                log.warning("could not read the backlog of binding %s (%s); letting its "
                            "workloads through until it can be read", binding.name, exc)
                size = 0
            seen = self._seen[binding.name] = (now, size)
        return seen[1] if seen[1] >= self.cap else None

    def _read(self, binding: Binding) -> int:
        if binding.source_kind == "queue":
            if self.queue is None:
                return 0
            return sum(c.ready + c.delayed for c in self.queue.counts(binding.tenant,
                                                                      binding.topic))
        if self._lag is None:
            self._lag = LagReader(self.settings, timeout_s=5.0)
        rows = self._lag.read(binding_targets(self.settings.names, [binding]))
        return sum(r.lag for r in rows)

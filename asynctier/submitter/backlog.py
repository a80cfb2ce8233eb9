"""A topic's backlog, read at most once per ``recheck_s``: ready and delayed items of a
queue topic (counted up to the cap only), or the consumer lag of a Kafka binding's group.

A reading is reused for ``recheck_s``, or for 20 times what it took when that is longer
(5 s at most), so that a long queue topic's checks cost a twentieth of the time they watch,
not a core; and for 5 s when it is :data:`FAR_BELOW` items or more under the cap (counting
a long topic for a cap nowhere near was a large share of PostgreSQL's work per accepted
workload in ``bench/submitter.py``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.lag import LagReader, binding_targets, start_offset

log = logging.getLogger(__name__)

#: A reading is reused for at least this many times what it took, up to MAX_REUSE_S.
REUSE = 20
MAX_REUSE_S = 5.0
#: A reading this many items under the cap is reused for MAX_REUSE_S: that headroom takes
#: more than 5 s to fill at 50,000 workloads a second.
FAR_BELOW = 250_000


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
        self._seen: dict[str, tuple[float, int]] = {}  # binding: (reuse until, size)
        self._lag: LagReader | None = None
        # one thread reads: the Kafka clients of the lag reader stay on it, and are closed
        # by :meth:`close` on it, never left to the garbage collector
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="submitter-backlog")

    async def over_cap(self, binding: Binding) -> int | None:
        """The backlog when it is over the cap, else None."""
        now = self._clock()
        seen = self._seen.get(binding.name)
        if seen is None or now >= seen[0]:
            try:
                size = await asyncio.get_running_loop().run_in_executor(
                    self._reader, self._read, binding)
            except Exception as exc:
                log.warning("could not read the backlog of binding %s (%s); letting its "
                            "workloads through until it can be read", binding.name, exc)
                size = 0
            took = self._clock() - now
            reuse = max(self.recheck_s, min(REUSE * took, MAX_REUSE_S))
            if self.cap - size >= FAR_BELOW:
                reuse = max(reuse, MAX_REUSE_S)
            seen = self._seen[binding.name] = (now + reuse, size)
        return seen[1] if seen[1] >= self.cap else None

    def _read(self, binding: Binding) -> int:
        if binding.source.kind == "queue":
            if self.queue is None:
                return 0
            route = self.queue.route_of(binding.tenant, binding.source.topic)  # follows a failover
            return int(route.waiting(binding.tenant, binding.source.topic, self.cap))
        if self._lag is None:
            self._lag = LagReader(self.settings, timeout_s=5.0)
        # offsets only (the admin client): no consumer, no record fetched
        [target] = binding_targets(self.settings.names, [binding])
        partitions = self._lag.topics().get(target.topic, 0)
        marks = self._lag.watermarks([(target.topic, p) for p in range(partitions)])
        committed = self._lag.committed(target.group, target.topic, partitions)
        return sum(max(0, end - start_offset(committed[p], low))
                   for (_, p), (low, end) in marks.items())

    def close(self) -> None:
        """Close the lag reader's clients (on the reading thread) and stop it."""
        self._reader.submit(self._close_lag).result(30)
        self._reader.shutdown(wait=True)

    def _close_lag(self) -> None:
        if self._lag is not None:
            self._lag.close()
            self._lag = None

"""Chunk sizes learned per binding: a chunk should hold a worker for about a target time.

A binding not measured yet starts with small chunks (its function may be slow).

Small chunks keep priorities and fairness sharp (a worker is never held long by one
tenant); large chunks keep the per-chunk overhead low for fast functions. The sizer keeps
an average time per item for each binding and sizes the next chunks from it.

An async function's items run concurrently within a chunk (all of them start together, up
to :data:`~asynctier.scheduler.runtime.ASYNC_LANES`): a chunk takes about as long
as its slowest item whatever its size, and its time per item says little (it grows with
whatever else the event loop runs). Once measured (``observe(..., concurrent=True)``), such
a binding gets chunks of ``max_items``, which keeps the per-chunk overhead low.

A sync chunk of a function that waits runs in several threads at once (the runtime cuts
it into parts). Once measured so (``observe(..., spread=True)``, from each thread's own
time per item), such a binding is sized for ``spread_target_s``: its worker mostly waits
on threads, while each chunk costs the event loop a wake-up, a write-down and an answer,
and the loop's time is what slows the threads (they queue for the GIL it holds), so
fewer, longer parts ran faster (bench/RESULTS.md).
"""

from __future__ import annotations

import math
from typing import TypeVar

T = TypeVar("T")


class ChunkSizer:
    """Chunk size per binding from its measured seconds per item (EWMA)."""

    def __init__(self, target_s: float = 0.02, min_items: int = 8, max_items: int = 256,
                 first_items: int = 4, alpha: float = 0.3,
                 spread_target_s: float | None = None) -> None:
        self.target_s = target_s
        self.spread_target_s = 2 * target_s if spread_target_s is None else spread_target_s
        self.min_items = min_items
        self.max_items = max(max_items, min_items)
        self.first_items = max(1, min(first_items, self.max_items))
        self.alpha = alpha
        self._per_item_s: dict[str, float] = {}
        self._concurrent: set[str] = set()
        self._spread: set[str] = set()

    def target(self, binding: str) -> float:
        """How long a chunk of ``binding`` should hold its worker."""
        return self.spread_target_s if binding in self._spread else self.target_s

    def size(self, binding: str, cautious: bool = False) -> int:
        """Items per chunk for ``binding``; ``cautious``: one while it is not measured."""
        per_item = self._per_item_s.get(binding)
        if per_item is None:
            return 1 if cautious else self.first_items
        if per_item <= 0 or binding in self._concurrent:
            return self.max_items
        target = self.target(binding)
        if per_item >= target:
            # an item that alone fills the target runs alone: the items of a slow (long)
            # function do not wait behind each other in one worker
            return 1
        return max(self.min_items, min(self.max_items, int(target / per_item)))

    def observe(self, binding: str, seconds: float, items: int,
                concurrent: bool = False, spread: bool = False) -> None:
        """A chunk of ``items`` items of ``binding`` took ``seconds``; ``concurrent``: its
        items ran at once (an async function); ``spread``: it ran in several threads at
        once (``seconds`` then by one thread's clock)."""
        if items <= 0:
            return
        for flag, flagged in ((concurrent, self._concurrent), (spread, self._spread)):
            if flag:
                flagged.add(binding)
            else:
                flagged.discard(binding)
        sample = seconds / items
        old = self._per_item_s.get(binding)
        self._per_item_s[binding] = sample if old is None else old + self.alpha * (sample - old)

    def split(self, binding: str, items: list[T], spread: int = 1,
              at_least: int = 1, cautious: bool = False) -> list[list[T]]:
        """``items`` cut into even chunks of at most :meth:`size` items, and into at least
        ``spread`` chunks when there are enough items and the whole would hold one worker
        longer than the target time (so idle workers share a long batch; a short one is
        not worth the thread hops); never smaller than ``at_least`` (up to ``max_items``)
        items. ``cautious`` (long work): a binding not measured yet runs one item per chunk,
        since its function may take minutes and an item must not wait behind another."""
        size = self.size(binding, cautious)
        per_item = self._per_item_s.get(binding)
        if per_item is None or len(items) * per_item > self.target(binding):
            size = min(size, math.ceil(len(items) / max(spread, 1)))
        size = max(size, min(at_least, self.max_items))
        if len(items) <= size:
            return [items]
        count = math.ceil(len(items) / size)
        step = math.ceil(len(items) / count)
        return [items[i:i + step] for i in range(0, len(items), step)]

"""The concurrency gate: a binding's ``max_concurrency``, narrowed by its adaptive limit.

A capped binding keeps at most ``capped_chunks_per_binding`` chunks in this scheduler (so
that chunks waiting for its slots cannot hold every worker) and runs one item at a time
inside :meth:`Admission.slot`, in up to its limit of lanes. The limit is the cap, or the
admission's adaptive (AIMD) limit within it, which every chunk's outcomes feed.

A binding without a cap is never slowed by its failures: at a 100% failure rate its topic
must still drain at full speed into the delay topics (docs/design.md, invariant 3).
Downstream protection is for bindings that declared what their downstream takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence

from asynctier.platform.binding import Binding
from asynctier.platform.wire import DECODE_REASONS, Item, Outcome
from asynctier.scheduler.admission import Admission
from asynctier.scheduler.bounded import Chunk
from asynctier.scheduler.gates.base import Gate, GateContext

log = logging.getLogger(__name__)


class CapGate(Gate):
    """Caps a binding's chunks queued and its items running; feeds its adaptive limit."""

    per_chunk = True

    def __init__(self, admission: Admission, capped_chunks: int) -> None:
        self.admission = admission
        self.capped_chunks = capped_chunks
        self._queued: dict[str, asyncio.Semaphore] = {}

    @classmethod
    def build(cls, ctx: GateContext) -> CapGate:
        """On the scheduler's admission, with its options' chunks per capped binding."""
        return cls(ctx.admission, ctx.options.capped_chunks_per_binding)

    def lanes(self, binding: Binding) -> int | None:
        """None without a cap; with one, the adaptive limit within it."""
        cap = binding.limits.max_concurrency
        if not cap:
            return None
        try:
            limit = self.admission.concurrency_limit(binding)
        except Exception:
            log.exception("binding %s: admission.concurrency_limit failed", binding.name)
            return cap
        return min(cap, limit) if isinstance(limit, int) and limit > 0 else cap

    async def enqueue(self, chunk: Chunk) -> None:
        """A capped binding's chunk waits for one of its places in the queue, held until
        the chunk is answered."""
        if not self.lanes(chunk.binding):
            return
        places = self._queued.get(chunk.binding.name)
        if places is None:
            places = self._queued[chunk.binding.name] = asyncio.Semaphore(self.capped_chunks)
        await places.acquire()
        chunk.future.add_done_callback(lambda _: places.release())

    def slot(self, binding: Binding) -> contextlib.AbstractAsyncContextManager[None]:
        """One concurrency slot of ``binding``."""
        return self.admission.slot(binding)

    async def after_run(self, binding: Binding, items: Sequence[Item],
                        outcomes: list[Outcome]) -> list[Outcome]:
        """Report the chunk's successes and failures, counted by reason: bad input says
        nothing about the downstream's health."""
        reasons = Counter([o["reason"] for o in outcomes if o["status"] != "ok"])
        good = len(outcomes) - reasons.total()
        bad = reasons.total() - sum(reasons[r] for r in DECODE_REASONS)
        try:
            self.admission.report(binding, good, bad)
        except Exception:
            log.exception("binding %s: admission.report failed", binding.name)
        return outcomes

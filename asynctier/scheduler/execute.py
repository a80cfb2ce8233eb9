"""Running a chunk's admitted items: the whole chunk in one worker hop, or, for a binding
a gate caps, one item at a time inside that gate's slot, in up to its lanes.

The time a chunk took teaches the chunk sizer (:mod:`.sizing`) how long the binding's items
take; the successes of a chunk spread over threads are written down while it still runs
(:meth:`~.claims.Claims.write_early`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.errors import FunctionNotFound, ModuleNotAllowed
from asynctier.platform.wire import FUNCTION_ERROR, Item, Outcome, failed, retry
from asynctier.scheduler.claims import Claims
from asynctier.scheduler.gates import Capping, Gate
from asynctier.scheduler.outcomes import error_text
from asynctier.scheduler.runtime import Job, Runtime
from asynctier.scheduler.sizing import ChunkSizer

log = logging.getLogger(__name__)


class Executor:
    """Runs admitted items on the runtime and measures them."""

    def __init__(self, runtime: Runtime, sizer: ChunkSizer, claims: Claims,
                 retry_s: float) -> None:
        self.runtime = runtime
        self.sizer = sizer
        self.claims = claims
        self.retry_s = retry_s
        self._background: set[asyncio.Future[None]] = set()

    async def run(self, binding: Binding, items: list[Item], written: set[int],
                  capping: Capping) -> list[Outcome]:
        """Run ``items``; the successes of a chunk spread over threads are written down
        while it runs, and their ids added to ``written``."""
        try:
            job = self.runtime.job(binding)
        except (ModuleNotAllowed, FunctionNotFound) as exc:
            return [failed(i["id"], str(exc), FUNCTION_ERROR) for i in items]
        started = time.monotonic()
        metrics.observe_record_ages(binding.name, [i["record_time_ms"] for i in items],
                                    time.time())
        if capping:
            outcomes = await self._run_capped(job, items, *capping)
        elif not binding.execution.idempotent:
            outcomes = await self.runtime.run(
                job, items, lambda done, oks: self.claims.write_early(binding, written, done,
                                                                      oks))
        else:
            outcomes = await self.runtime.run(job, items)
        took = time.monotonic() - started
        if not capping:
            self.sizer.observe(binding.name, self.runtime.work_s(job, len(items), took),
                               len(items), job.function.is_async,
                               self.runtime.parts(binding.name, len(items)) > 1)
        # Items of a chunk run one after another: each is counted at the chunk's mean.
        metrics.observe_durations(binding.name, [took / len(items)], repeat=len(items))
        return outcomes

    async def _run_capped(self, job: Job, items: Sequence[Item], lanes: int,
                          gate: Gate) -> list[Outcome]:
        results: list[Outcome] = []
        pending = iter(items)

        async def lane() -> None:
            for item in pending:
                results.append(await self._run_in_slot(job, item, gate))

        await asyncio.gather(*(lane() for _ in range(min(lanes, len(items)))))
        return results

    async def _run_in_slot(self, job: Job, item: Item, gate: Gate) -> Outcome:
        """Run one item inside a concurrency slot. A sync call that overran its timeout
        is answered ``timeout`` at once, but its slot is not free until the call returns
        (its thread cannot be stopped): a background task holds it until then."""
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._hold_slot(job, item, gate, answer))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if not answer.done():  # the caller went away before it ended: stop it
                task.cancel()
            raise

    async def _hold_slot(self, job: Job, item: Item, gate: Gate,
                         answer: asyncio.Future[Outcome]) -> None:
        try:
            async with gate.slot(job.binding):
                outcome, late = await self.runtime.run_one_held(job, item)
                if not answer.done():
                    answer.set_result(outcome)
                if late:
                    await asyncio.gather(*late, return_exceptions=True)
        except Exception as exc:  # the slot could not be had (run_one_held never raises)
            if not answer.done():
                answer.set_result(retry(item["id"], f"admission failed: {error_text(exc)}",
                                        after_s=self.retry_s, spends_attempt=False))
            else:
                log.exception("binding %s: releasing a concurrency slot failed",
                              job.binding.name)

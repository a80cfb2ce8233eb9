"""Dispatch: admitting a binding's items, queueing them in chunks, running the chunks.

Per chunk (never per item), in this order:

1. **Intake** (:meth:`Dispatcher.submit`, in the caller's task, holding no worker):
   :meth:`Admission.over_quota` (those items get a ``retry`` that spends no attempt),
   then :meth:`Admission.take_tokens` (a rate-limited binding's call simply takes
   longer), then room in the bounded queue. Waiting for tokens here rather than in a
   worker means a throttled binding cannot hold the workers that other bindings need.
2. **Run** (one of ``workers`` worker tasks, picked by tier and tenant): the whole chunk in
   one worker hop, or, for a binding with a concurrency limit, one item at a time inside
   :meth:`Admission.slot` with up to that many lanes in parallel. The limit is the
   binding's ``max_concurrency``, else the admission's current adaptive limit when it
   offers one (an optional ``concurrency_limit(binding) -> int | None`` method, as
   :class:`~asynctier.platform.limits.RedisAdmission` has: AIMD shrinks it when failures
   spike).
3. :meth:`Admission.report` with the successes and failures of the chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from asynctier.platform import metrics
from asynctier.platform.admission import Admission
from asynctier.platform.binding import Binding
from asynctier.platform.errors import FunctionNotFound, ModuleNotAllowed
from asynctier.platform.limits.bucket import burst_of
from asynctier.platform.scheduler.bounded import BoundedQueue, Chunk
from asynctier.platform.scheduler.outcomes import error_text
from asynctier.platform.scheduler.runtime import Job, Runtime
from asynctier.platform.scheduler.sizing import ChunkSizer
from asynctier.platform.wire import Item, Outcome, failed, retry

log = logging.getLogger(__name__)


def _fits_one_burst(binding: Binding, n: int) -> bool:
    """True when ``n`` items fit in the binding's token bucket at once (or it has none)."""
    return binding.rate_per_s is None or n <= burst_of(binding)


class Dispatcher:
    """Admits, queues and runs chunks with ``workers`` worker tasks."""

    def __init__(self, runtime: Runtime, admission: Admission, queue: BoundedQueue,
                 sizer: ChunkSizer, workers: int = 8, capped_chunks: int = 2,
                 admission_retry_s: float = 5.0) -> None:
        self.runtime = runtime
        self.admission = admission
        self.queue = queue
        self.sizer = sizer
        self.workers = workers
        self.capped_chunks = capped_chunks
        self.admission_retry_s = admission_retry_s
        self.running_items = 0
        self._capped: dict[str, asyncio.Semaphore] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the worker tasks on the running loop."""
        self._tasks = [asyncio.create_task(self._work(), name=f"scheduler-worker-{n}")
                       for n in range(self.workers)]

    async def stop(self) -> None:
        """Stop the workers (chunks still queued are not run)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- intake ---------------------------------------------------------------------------

    async def submit(self, binding: Binding, items: list[Item]) -> list[Outcome]:
        """Every outcome of ``items`` (all of ``binding``); waits while the queue is full."""
        results: list[Outcome] = []
        futures: list[asyncio.Future[list[Outcome]]] = []
        cap = self._cap(binding)
        admitted = False
        if _fits_one_burst(binding, len(items)):
            # One admission round trip for the whole batch when the bucket could hand it
            # out at once anyway; chunk by chunk only when the rate limit really binds.
            refused, items = await self._admit_or_retry(binding, items)
            results.extend(refused)
            admitted = True
        try:
            for part in self.sizer.split(binding.name, items, self.workers, cap or 1):
                refused, chunk = await self._intake(binding, part, admitted)
                results.extend(refused)
                if chunk is not None:
                    futures.append(chunk.future)
            for done in await asyncio.gather(*futures):
                results.extend(done)
        finally:
            for future in futures:  # the caller went away: queued chunks are skipped
                future.cancel()
        return results

    async def _admit_or_retry(self, binding: Binding,
                              items: list[Item]) -> tuple[list[Outcome], list[Item]]:
        try:
            return await self._admit(binding, items)
        except Exception as exc:
            log.error("binding %s: admission failed (%s); %d item(s) will come back in %gs",
                      binding.name, error_text(exc), len(items), self.admission_retry_s)
            return [retry(i["id"], f"admission failed: {error_text(exc)}",
                          after_s=self.admission_retry_s, spends_attempt=False)
                    for i in items], []

    async def _intake(self, binding: Binding, items: list[Item],
                      admitted_already: bool = False) -> tuple[list[Outcome], Chunk | None]:
        refused: list[Outcome] = []
        if admitted_already:
            admitted = items
        else:
            refused, admitted = await self._admit_or_retry(binding, items)
        if not admitted:
            return refused, None
        chunk = Chunk(binding, admitted, asyncio.get_running_loop().create_future())
        if self._cap(binding):
            await self._capped_gate(chunk)
        chunk.queued_at = time.monotonic()
        await self.queue.put(chunk)
        return refused, chunk

    async def _admit(self, binding: Binding, items: list[Item]) -> tuple[list[Outcome],
                                                                         list[Item]]:
        over = await self.admission.over_quota(binding, items)
        refused = [retry(i["id"], f"tenant {binding.tenant} is over its quota",
                         after_s=over[i["id"]], spends_attempt=False)
                   for i in items if i["id"] in over] if over else []
        admitted = [i for i in items if i["id"] not in over] if over else items
        if admitted:
            await self.admission.take_tokens(binding, len(admitted))
        return refused, admitted

    async def _capped_gate(self, chunk: Chunk) -> None:
        gate = self._capped.get(chunk.binding.name)
        if gate is None:
            gate = self._capped[chunk.binding.name] = asyncio.Semaphore(self.capped_chunks)
        await gate.acquire()
        chunk.future.add_done_callback(lambda _: gate.release())

    # -- running --------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            chunk = await self.queue.get()
            metrics.set_queue_depths(self.queue.fair.items_by_tier())
            if chunk.future.done():
                continue
            self.running_items += chunk.cost
            try:
                outcomes = await self._run(chunk)
            except Exception as exc:  # a bug here must not lose the items: they come back
                log.exception("binding %s: a chunk failed in the scheduler", chunk.binding.name)
                outcomes = [retry(i["id"], f"scheduler error: {error_text(exc)}",
                                  spends_attempt=False, after_s=self.admission_retry_s)
                            for i in chunk.items]
            finally:
                self.running_items -= chunk.cost
            if not chunk.future.done():
                chunk.future.set_result(outcomes)

    async def _run(self, chunk: Chunk) -> list[Outcome]:
        binding = chunk.binding
        try:
            job = self.runtime.job(binding)
        except (ModuleNotAllowed, FunctionNotFound) as exc:
            return [failed(i["id"], str(exc)) for i in chunk.items]
        started = time.monotonic()
        items = chunk.items
        metrics.observe_record_ages(binding.name, [i["record_time_ms"] for i in items],
                                    time.time())
        cap = self._cap(binding)
        if cap:
            outcomes = await self._run_capped(job, items, cap)
        else:
            outcomes = await self.runtime.run(job, items)
        took = time.monotonic() - started
        if not cap:
            self.sizer.observe(binding.name, took, chunk.cost)
        # Items of a chunk run one after another: each is counted at the chunk's mean.
        metrics.observe_durations(binding.name, [took / len(items)], repeat=len(items))
        self._report(binding, outcomes)
        return outcomes

    def _cap(self, binding: Binding) -> int | None:
        """The binding's concurrency limit now: None without a cap; with one, the adaptive
        (AIMD) limit within it when the admission offers one.

        A binding without a cap is never slowed by its failures: at a 100% failure rate its
        topic must still drain at full speed into the delay topics (DESIGN invariant 3).
        Downstream protection is for bindings that declared what their downstream takes.
        """
        cap = binding.max_concurrency
        if not cap:
            return None
        adaptive = getattr(self.admission, "concurrency_limit", None)
        if adaptive is None:
            return cap
        try:
            limit = adaptive(binding)
        except Exception:
            log.exception("binding %s: admission.concurrency_limit failed", binding.name)
            return cap
        return min(cap, limit) if isinstance(limit, int) and limit > 0 else cap

    async def _run_capped(self, job: Job, items: Sequence[Item], cap: int) -> list[Outcome]:
        results: list[Outcome] = []
        pending = iter(items)

        async def lane() -> None:
            for item in pending:
                try:
                    async with self.admission.slot(job.binding):
                        results.append(await self.runtime.run_one(job, item))
                except Exception as exc:  # the slot could not be had (run_one never raises)
                    results.append(retry(item["id"], f"admission failed: {error_text(exc)}",
                                         after_s=self.admission_retry_s,
                                         spends_attempt=False))

        await asyncio.gather(*(lane() for _ in range(min(cap, len(items)))))
        return results

    def _report(self, binding: Binding, outcomes: list[Outcome]) -> None:
        good = bad = 0
        for outcome in outcomes:
            if outcome["status"] == "ok":
                good += 1
            elif not (outcome["error"] or "").startswith("undecodable:"):
                bad += 1  # bad input says nothing about the downstream's health
        try:
            self.admission.report(binding, good, bad)
        except Exception:
            log.exception("binding %s: admission.report failed", binding.name)

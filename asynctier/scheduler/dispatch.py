"""Dispatch: a binding's items through the gates, into the queue in chunks, to the workers.

1. **Intake** (:meth:`Dispatcher.submit`, in the caller's task, holding no worker): the
   per-batch gates (:mod:`.gates`), the run-once claim (:mod:`.claims`), then per chunk
   the per-chunk gates and room in the bounded queue.
2. **Run** (one of ``workers`` worker tasks, picked by tier, tenant and deadline): the
   gates are asked again as the chunk leaves the queue, the rest runs
   (:mod:`.execute`), the gates see its outcomes, and the chunk is written down and
   answered (:meth:`~.claims.Claims.write_down`).

The gates' order is written once, in :mod:`.gates.order`; what is left here is the
dispatcher's own: queueing, chunking, running and answering.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from asynctier.platform import metrics, tracing
from asynctier.platform.binding import Binding
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.supervise import supervise_task
from asynctier.platform.wire import Item, Outcome, retry
from asynctier.scheduler.admission import Admission
from asynctier.scheduler.bounded import BoundedQueue, Chunk
from asynctier.scheduler.claims import Claims
from asynctier.scheduler.deadlines import order_key, stamp_deadlines
from asynctier.scheduler.execute import Executor
from asynctier.scheduler.gates import GATES, Admitted, GateContext, GateFactory, Gates
from asynctier.scheduler.guard import Guard, OpenGuard
from asynctier.scheduler.limits.breaker import Breakers
from asynctier.scheduler.limits.bucket import burst_of
from asynctier.scheduler.options import SPARE_WORKERS, SchedulerOptions
from asynctier.scheduler.outcomes import error_text
from asynctier.scheduler.runtime import Runtime
from asynctier.scheduler.sizing import ChunkSizer

if TYPE_CHECKING:
    from asynctier.scheduler.traces import AttemptSpans

log = logging.getLogger(__name__)

#: Called with outcomes as they are known (a run stream sends them at once).
Report = Callable[[list[Outcome]], None]


def _report_now(report: Report | None, outcomes: list[Outcome]) -> None:
    if report is not None and outcomes:
        report(outcomes)


def _reporter(report: Report) -> Callable[[asyncio.Future[list[Outcome]]], None]:
    """A done-callback of a chunk's future that reports its outcomes."""
    def done(future: asyncio.Future[list[Outcome]]) -> None:
        if not future.cancelled() and future.exception() is None:
            report(future.result())
    return done


def _ending_spans(spans: AttemptSpans, report: Report) -> Report:
    """``report`` that first ends the spans of the outcomes it sends."""
    def sent(outcomes: list[Outcome]) -> None:
        spans.end(outcomes, rest=False)
        report(outcomes)
    return sent


def _fits_one_burst(binding: Binding, n: int) -> bool:
    """True when ``n`` items fit in the binding's token bucket at once (or it has none)."""
    return binding.limits.rate_per_s is None or n <= burst_of(binding)


class Dispatcher:
    """Admits, queues and runs chunks with ``options.workers`` worker tasks."""

    def __init__(self, runtime: Runtime, admission: Admission, queue: BoundedQueue,
                 sizer: ChunkSizer, options: SchedulerOptions | None = None, *,
                 guard: Guard | None = None, breakers: Breakers | None = None,
                 gates: Sequence[GateFactory] = GATES) -> None:
        options = options or SchedulerOptions()
        self.queue, self.sizer, self.workers = queue, sizer, options.workers
        self.retry_s = options.admission_error_retry_s
        self.default_window_s = options.default_start_within_s
        self.claims = Claims(guard or OpenGuard(), self.retry_s)
        self.gates = Gates(GateContext(admission, breakers, queue, options,
                                       self.claims.answer), gates)
        self.executor = Executor(runtime, sizer, self.claims, self.retry_s)
        self.running_items = 0
        self.running: dict[tuple[str, str], int] = {}  # chunks running by (tier, tenant)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the worker tasks and the spare ones, and the gates, on the running loop."""
        self._tasks = [supervise_task(
            f"scheduler-worker-{n}", self._work, what=f"scheduler worker {n}",
            hint="The scheduler runs with one worker less meanwhile.",
            on_restart=metrics.count_task_restart) for n in range(self.workers)]
        self._tasks += [supervise_task(
            f"scheduler-spare-worker-{n}", lambda: self._work(spare=True),
            what=f"the scheduler's spare worker {n}",
            hint="A trickling tenant's work waits for a worker meanwhile.",
            on_restart=metrics.count_task_restart) for n in range(SPARE_WORKERS)]
        self.gates.start()

    async def stop(self) -> None:
        """Stop the workers (chunks still queued are not run) and the gates, then wait
        for the write-downs of the chunks that ran."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self.gates.close()
        await self.claims.stop()

    # -- intake ---------------------------------------------------------------------------

    async def submit(self, binding: Binding, items: list[Item],
                     report: Report | None = None) -> list[Outcome]:
        """Every outcome of ``items`` (all of ``binding``); waits while the queue is full.

        With ``report`` (a run stream), ``report(outcomes)`` is called as each chunk
        ends, and each item is a chunk of its own when the binding's timeout is above its
        ``queue_after_s`` (long work); the outcomes are returned at the end all the same.
        """
        stamp_deadlines(binding, items)
        if not tracing.enabled():
            return await self._submit(binding, items, report)
        from asynctier.scheduler.traces import AttemptSpans  # OpenTelemetry: only while on

        spans, results = AttemptSpans(binding, items), []
        if report is not None:  # a run stream: each span ends as its outcome is sent
            report = _ending_spans(spans, report)
        try:
            results = await self._submit(binding, items, report)
            return results
        finally:
            spans.end(results)

    async def _submit(self, binding: Binding, items: list[Item],
                      report: Report | None) -> list[Outcome]:
        refused, items = await self.gates.admit_batch(binding, items)
        skipped, items, busy = await self.claims.claim_batch(binding, items)
        skipped = refused + skipped
        _report_now(report, skipped)
        waiting = (asyncio.create_task(self.claims.when_free(binding, busy, self._queue_all))
                   if busy else None)
        try:
            results = skipped + await self._queue_all(binding, items, report)
            if waiting is not None:
                results += await waiting
        finally:
            if waiting is not None:
                waiting.cancel()
        return results

    async def _queue_all(self, binding: Binding, items: list[Item],
                         report: Report | None = None) -> list[Outcome]:
        """Queue claimed ``items`` in chunks and wait for their outcomes. A chunk is sized
        from the binding's measured time per item (:mod:`.sizing`); when the whole batch
        fits the binding's bucket at once, the per-chunk gates are asked once for it."""
        results: list[Outcome] = []
        futures: list[asyncio.Future[list[Outcome]]] = []
        parts: list[list[Item]] | None = None
        queued = 0
        admitted = _fits_one_burst(binding, len(items))
        try:
            if admitted:
                refused, items = await self._admit_chunk(binding, items)
                results.extend(refused)
                _report_now(report, refused)
            parts = self._split(binding, items, report is not None)
            for part in parts:
                refused, chunk = await self._intake(binding, part, admitted)
                queued += 1
                results.extend(refused)
                _report_now(report, refused)
                if chunk is not None:
                    futures.append(chunk.future)
                    if report is not None:
                        chunk.future.add_done_callback(_reporter(report))
            for done in await asyncio.gather(*futures):
                results.extend(done)
        finally:
            for future in futures:  # the caller went away: queued chunks are skipped
                future.cancel()
            # ... and the records it claimed that were neither queued nor refused are free
            left = items if parts is None else [i for part in parts[queued:] for i in part]
            if left:
                self.claims.free_later(binding, left)
        return results

    def _split(self, binding: Binding, items: list[Item], streamed: bool) -> list[list[Item]]:
        capping = self.gates.capping(binding)
        if streamed and not capping and binding.execution.timeout_s > binding.source.queue_after_s:
            return [[item] for item in items]  # long work by its timeout: each alone
        return self.sizer.split(binding.name, items, self.workers,
                                capping[0] if capping else 1, cautious=streamed)

    async def _admit_chunk(self, binding: Binding, items: list[Item]) -> Admitted:
        """Ask the per-chunk gates; what they refuse was claimed but does not run here, so
        it is freed for the copy that comes back. A gate that fails refuses the chunk."""
        try:
            refused, admitted = await self.gates.admit_chunk(binding, items)
        except Exception as exc:
            log.error("binding %s: admission failed (%s); %d item(s) will come back in %gs",
                      binding.name, error_text(exc), len(items), self.retry_s)
            refused = [retry(i["id"], f"admission failed: {error_text(exc)}",
                             after_s=self.retry_s, spends_attempt=False) for i in items]
            admitted = []
        if refused:
            ids = {o["id"] for o in refused}
            await self.claims.finish(binding, [i for i in items if i["id"] in ids], refused)
        return refused, admitted

    async def _intake(self, binding: Binding, items: list[Item],
                      admitted_already: bool) -> tuple[list[Outcome], Chunk | None]:
        refused: list[Outcome] = []
        if not admitted_already:
            refused, items = await self._admit_chunk(binding, items)
        if not items:
            return refused, None
        chunk = Chunk(binding, items, asyncio.get_running_loop().create_future(),
                      deadline=order_key(binding, items, time.time(), self.default_window_s))
        await self.gates.enqueue(chunk)
        await self.queue.put(chunk)
        return refused, chunk

    # -- running --------------------------------------------------------------------------

    async def _work(self, spare: bool = False) -> None:
        """Run chunks as they leave the queue; ``spare``: only trickles
        (:data:`SPARE_WORKERS`)."""
        while True:
            chunk = await (self.queue.get_trickle(self.running) if spare else self.queue.get())
            metrics.set_queue_depths(self.queue.fair.items_by_tier())
            outcomes: list[Outcome] | None = None
            if not chunk.future.done():  # else its caller went away: it runs when sent again
                self.running_items += chunk.cost
                key = (chunk.binding.priority, chunk.binding.tenant)
                self.running[key] = self.running.get(key, 0) + 1
                try:
                    outcomes = await self._run(chunk)
                except Exception as exc:  # a bug here must not lose the items: they come back
                    log.exception("binding %s: a chunk failed in the scheduler",
                                  chunk.binding.name)
                    outcomes = [retry(i["id"], f"scheduler error: {error_text(exc)}",
                                      spends_attempt=False, after_s=self.retry_s)
                                for i in chunk.items]
                finally:
                    self.running_items -= chunk.cost
                    self._ended(key)
            self.claims.write_down(chunk, outcomes)

    def _ended(self, key: tuple[str, str]) -> None:
        """A chunk of ``key`` (tier, tenant) ended: at the last one, the spare worker may
        take that tenant's next."""
        left = self.running[key] - 1
        if left:
            self.running[key] = left
        else:
            del self.running[key]
            self.queue.wake_trickle()

    async def _run(self, chunk: Chunk) -> list[Outcome]:
        binding = chunk.binding
        if tracing.enabled():
            from asynctier.scheduler.traces import note_wait

            note_wait(chunk.items, "waited in the queue", self.queue.clock() - chunk.queued_at)
        refused, items = self.gates.dequeue(binding, chunk.items)
        if not items:
            return refused
        outcomes = await self.executor.run(binding, items, chunk.written,
                                           self.gates.capping(binding))
        return refused + await self.gates.after_run(binding, items, outcomes)

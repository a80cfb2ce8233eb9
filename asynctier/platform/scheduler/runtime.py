"""Running a chunk of one binding's items: async functions on the event loop, sync ones
in a bounded thread pool with ONE thread hop per chunk, or in worker processes for a
binding bound ``--isolation process`` (:mod:`asynctier.platform.scheduler.processes`:
a call past its timeout is stopped, its process killed and replaced).

A sync chunk runs its items one after another in one worker thread (:class:`SyncRun`), so
the per-item cost is a function call, not a thread hand-off. The event loop watches the
run: when the item in progress passes the binding's timeout, the loop stops waiting for
it (an attempt failed with reason ``timeout``), and sends the rest of the chunk on another
hop. Python cannot stop a thread, so **an overrunning sync call keeps its worker thread**
until it returns: it is logged (binding and item), counted
(``asynctier_function_timeouts_total{outcome="left_running"}``,
``asynctier_overrunning_calls``), counted in the scheduler's load, and, for a binding with
a concurrency cap, keeps its slot until it returns (:meth:`Runtime.run_one_held`). A sync
call that returns late (past the timeout) is a ``timeout`` failure too.

An async chunk runs its items concurrently on the loop in up to :data:`ASYNC_LANES` lanes
(one task per lane, not per item), each item under ``asyncio.timeout`` (the equivalent of
``asyncio.wait_for`` without its extra task).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.context import Context
from asynctier.platform.errors import DecodeError
from asynctier.platform.scheduler import outcomes
from asynctier.platform.scheduler.payloads import Decoder, decoder_for
from asynctier.platform.scheduler.processes import ProcessPool
from asynctier.platform.scheduler.resolver import Function, FunctionResolver
from asynctier.platform.wire import Item, Outcome, ok

log = logging.getLogger(__name__)

#: How long past an item's timeout the loop waits before giving up on its thread.
WATCH_GRACE_S = 0.05
#: Items of one async chunk running at once.
ASYNC_LANES = 64


@dataclass(frozen=True)
class Job:
    """What running a binding's items needs: the binding, its function, its decoder."""

    binding: Binding
    function: Function
    decode: Decoder
    binding_bytes: bytes = b""  # --isolation process: the binding, for the worker

    @property
    def in_process(self) -> bool:
        """True when its items run in worker processes (a sync function, isolated)."""
        return self.binding.isolation == "process" and not self.function.is_async


def context_of(binding: Binding, item: Item, deadline: float) -> Context:
    """The ``ctx`` of one item (positional arguments: built once per item, hot path);
    ``ctx.deadline`` is the record's deadline when it has one, else ``deadline``."""
    headers = item["headers"]
    if item["deadline_ms"] is not None:
        deadline = item["deadline_ms"] / 1000.0
    return Context(binding.name, item["key"],
                   tuple((h["name"], h["value"]) for h in headers) if headers else (),
                   item["source_ref"], item["attempt"], item["record_time_ms"] / 1000.0,
                   deadline, binding.tenant, item.get("resumed"), item.get("saver"))


class SyncRun:
    """One thread hop: runs ``items`` in order until done or abandoned by the loop."""

    def __init__(self, job: Job, items: Sequence[Item]) -> None:
        self.job = job
        self.items = items
        self.results: list[Outcome] = []
        self.started = 0.0
        self.abandoned = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        """Run in a worker thread.

        The hot loop of every sync function, so per item one lock: it hands the previous
        item's outcome over and starts the clock of the next, or stops when the loop has
        given up on this run. An item whose outcome is not handed over yet counts as in
        progress for the loop's watch, which gives up on an item only once its timeout has
        passed since it started: such an item is answered ``timed out``, as a late return
        is."""
        job, binding = self.job, self.job.binding
        decode, call = job.decode, job.function.call
        timeout = binding.timeout_s
        monotonic, lock, results = time.monotonic, self._lock, self.results
        wall_offset = time.time() - monotonic()
        outcome: Outcome | None = None
        for item in self.items:
            with lock:
                if self.abandoned:
                    return
                if outcome is not None:
                    results.append(outcome)
                self.started = started = monotonic()
            item_id = item["id"]
            try:
                payload = decode(item["payload"])
            except DecodeError as exc:
                outcome = outcomes.undecodable(item_id, str(exc))
                continue
            try:
                call(payload, context_of(binding, item, started + wall_offset + timeout))
            except BaseException as exc:  # a function may raise anything, even SystemExit
                outcome = outcomes.of_exception(item_id, exc)
            else:
                outcome = ok(item_id)
            if monotonic() - started > timeout:
                outcome = outcomes.timed_out(item_id, timeout)
        with lock:
            if not self.abandoned and outcome is not None:
                results.append(outcome)

    def wait_s(self) -> float:
        """Seconds until the item in progress is overdue (a full timeout before any)."""
        timeout = self.job.binding.timeout_s + WATCH_GRACE_S
        with self._lock:
            if self.started == 0.0:
                return timeout
            return max(0.0, self.started + timeout - time.monotonic())

    def abandon_if_overdue(self) -> bool:
        """Give up on the item in progress when it is past its timeout; True if so."""
        with self._lock:
            in_progress = self.started and len(self.results) < len(self.items)
            if in_progress and time.monotonic() - self.started > self.job.binding.timeout_s:
                self.abandoned = True
        return self.abandoned


class Runtime:
    """Resolves functions and runs chunks; owns the bounded pool of sync worker threads."""

    def __init__(self, resolver: FunctionResolver, threads: int = 8,
                 processes: int | None = None) -> None:
        self.resolver = resolver
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="asynctier-fn")
        self.processes = ProcessPool(resolver.allow_modules, processes or threads)
        self._jobs: dict[str, Job] = {}
        self.hung_threads = 0

    def job(self, binding: Binding) -> Job:
        """The job of ``binding``; ModuleNotAllowed / FunctionNotFound when refused."""
        job = self._jobs.get(binding.name)
        if job is None or job.binding is not binding:
            job = Job(binding, self.resolver.resolve(binding.function),
                      decoder_for(binding),
                      binding.encode() if binding.isolation == "process" else b"")
            self._jobs[binding.name] = job
        return job

    async def run(self, job: Job, items: Sequence[Item]) -> list[Outcome]:
        """Run every item of one chunk; one outcome per item."""
        return (await self.run_held(job, items))[0]

    async def run_held(self, job: Job, items: Sequence[Item]
                       ) -> tuple[list[Outcome], list[asyncio.Future[None]]]:
        """Run every item of one chunk: the outcomes, and the worker threads of calls
        that overran their timeout and still run (their outcome is ``timeout`` already)."""
        if job.function.is_async:
            return await run_async_chunk(job, items), []
        if job.in_process:
            return await self.processes.run(job, items), []
        return await self._run_sync(job, items)

    async def run_one(self, job: Job, item: Item) -> Outcome:
        """Run a single item."""
        return (await self.run(job, (item,)))[0]

    async def run_one_held(self, job: Job, item: Item
                           ) -> tuple[Outcome, list[asyncio.Future[None]]]:
        """Run a single item (inside a concurrency slot, which a call that overran its
        timeout keeps until the returned futures are done)."""
        results, late = await self.run_held(job, (item,))
        return results[0], late

    async def _run_sync(self, job: Job, items: Sequence[Item]
                        ) -> tuple[list[Outcome], list[asyncio.Future[None]]]:
        loop = asyncio.get_running_loop()
        results: list[Outcome] = []
        late: list[asyncio.Future[None]] = []
        while items:
            run = SyncRun(job, items)
            future = loop.run_in_executor(self.pool, run)
            await self._watch(run, future)
            results.extend(run.results)
            if not run.abandoned:
                break
            late.append(future)
            stuck = items[len(run.results)]
            results.append(outcomes.timed_out(stuck["id"], job.binding.timeout_s))
            items = items[len(run.results) + 1:]
        return results, late

    async def _watch(self, run: SyncRun, future: asyncio.Future[None]) -> None:
        while True:
            done, _ = await asyncio.wait((future,), timeout=run.wait_s())
            if done:
                future.result()
                return
            if run.abandon_if_overdue():
                self._count_hung(run, future)
                return

    def _count_hung(self, run: SyncRun, future: asyncio.Future[None]) -> None:
        self.hung_threads += 1
        binding = run.job.binding
        item = run.items[len(run.results)]
        metrics.count_timeout(binding.name, "left_running")
        metrics.add_overrunning(binding.name, 1)
        log.warning("binding %s: item %s (attempt %d) of %s ran past its %gs timeout; the "
                    "attempt failed (reason timeout), but a thread cannot be stopped: it "
                    "keeps running and holds its worker thread (%d of %d held by overrunning "
                    "calls) until it returns. Bind with --isolation process to have such "
                    "calls stopped.", binding.name, item["source_ref"], item["attempt"],
                    run.job.function.path, binding.timeout_s, self.hung_threads, self.threads,
                    extra={"binding": binding.name})
        started = time.monotonic()

        def back(_: Any) -> None:
            self.hung_threads -= 1
            metrics.add_overrunning(binding.name, -1)
            log.info("binding %s: the overrunning call of item %s returned after %.1fs; its "
                     "thread is free", binding.name, item["source_ref"],
                     binding.timeout_s + time.monotonic() - started)

        future.add_done_callback(back)

    def close(self) -> None:
        """Stop the pool without waiting for late (hung) calls; kill the worker processes."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.processes.close()


async def run_async_chunk(job: Job, items: Sequence[Item]) -> list[Outcome]:
    """Run a chunk of an async function in up to :data:`ASYNC_LANES` concurrent lanes."""
    if len(items) == 1:
        return [await run_async_item(job, items[0])]
    results: list[Outcome] = []
    pending = iter(items)

    async def lane() -> None:
        for item in pending:
            results.append(await run_async_item(job, item))

    await asyncio.gather(*(lane() for _ in range(min(ASYNC_LANES, len(items)))))
    return results


async def run_async_item(job: Job, item: Item) -> Outcome:
    """Run one item of an async function on the loop under the binding's timeout."""
    item_id = item["id"]
    try:
        payload = job.decode(item["payload"])
    except DecodeError as exc:
        return outcomes.undecodable(item_id, str(exc))
    timeout = job.binding.timeout_s
    ctx = context_of(job.binding, item, time.time() + timeout)
    try:
        async with asyncio.timeout(timeout):  # cheaper than wait_for: no extra task
            await job.function.call(payload, ctx)
    except TimeoutError:
        metrics.count_timeout(job.binding.name, "cancelled")
        return outcomes.timed_out(item_id, timeout)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # a function may raise anything
        return outcomes.of_exception(item_id, exc)
    return ok(item_id)

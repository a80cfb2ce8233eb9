"""Dispatch: admitting a binding's items, queueing them in chunks, running the chunks.

Per chunk (never per item), in this order:

0. **Claim** (per batch, :meth:`Admission.claim`): a record that already succeeded is
   answered ``ok`` without running; one still running elsewhere waits for that run. After
   a chunk ran, :meth:`Admission.finish` remembers its successes and frees the rest, in
   the background (the worker takes the next chunk): a chunk that all succeeded is
   answered at once (its claims hold until the marks land, so a copy read meanwhile
   waits), any other once the write landed.
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
   :class:`~asynctier.scheduler.limits.RedisAdmission` has: AIMD shrinks it when failures
   spike).
3. :meth:`Admission.report` with the successes and failures of the chunk.

Breakers (:mod:`asynctier.scheduler.limits.breaker`, when the scheduler has them): a
batch of a binding whose breaker is open or ramping is parked but for what the breaker lets
through; a chunk leaving the queue while it is open is parked but for its probes; each
chunk's outcomes are reported to it.

Deferral (:mod:`.deferral`): while this scheduler is saturated by work that does not
defer, a ``--defer-when-busy`` binding's records whose deadline is not near are parked
(a retry that spends no attempt): when their batch arrives, when saturation begins (its
chunks then queued are taken out of the queue) and when a chunk of them leaves the queue.

Deadlines (:mod:`.deadlines`): a batch's expired records are answered ``expired`` before
the claim, the others get their deadline, a chunk is queued by its earliest, and what
expired while queued is answered ``expired`` when the chunk leaves the queue, not run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.errors import FunctionNotFound, ModuleNotAllowed
from asynctier.platform.supervise import watch
from asynctier.platform.wire import FUNCTION_ERROR, UNDECODABLE, Item, Outcome, failed, ok, retry
from asynctier.scheduler.admission import BUSY, DONE, RUN, TAKEN_OVER, Admission
from asynctier.scheduler.bounded import BoundedQueue, Chunk
from asynctier.scheduler.deadlines import order_key, split_expired, stamp_deadlines
from asynctier.scheduler.deferral import Saturation, defer, may_wait, park
from asynctier.scheduler.limits.breaker import Breakers
from asynctier.scheduler.limits.bucket import burst_of
from asynctier.scheduler.outcomes import error_text
from asynctier.scheduler.runtime import Job, Runtime
from asynctier.scheduler.sizing import ChunkSizer

log = logging.getLogger(__name__)

#: A record running elsewhere is asked about again after this, doubling up to the max.
BUSY_POLL_FIRST_S = 0.05
BUSY_POLL_MAX_S = 1.0
#: How long stopping waits for the write-downs of the chunks that ran.
WRITE_DOWN_WAIT_S = 5.0


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


def _fits_one_burst(binding: Binding, n: int) -> bool:
    """True when ``n`` items fit in the binding's token bucket at once (or it has none)."""
    return binding.rate_per_s is None or n <= burst_of(binding)


class Dispatcher:
    """Admits, queues and runs chunks with ``workers`` worker tasks."""

    def __init__(self, runtime: Runtime, admission: Admission, queue: BoundedQueue,
                 sizer: ChunkSizer, workers: int = 8, capped_chunks: int = 2,
                 admission_retry_s: float = 5.0, busy_grace_s: float = 10.0,
                 default_window_s: float = 60.0, breakers: Breakers | None = None) -> None:
        self.runtime = runtime
        self.admission = admission
        self.queue = queue
        self.sizer = sizer
        self.workers = workers
        self.capped_chunks = capped_chunks
        self.admission_retry_s = admission_retry_s
        self.busy_grace_s = busy_grace_s
        self.default_window_s = default_window_s
        self.breakers = breakers
        self.saturation = Saturation(queue, on_start=self._park_queued)
        self.running_items = 0
        self._capped: dict[str, asyncio.Semaphore] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[None]] = set()
        self._writes: set[asyncio.Future[None]] = set()  # chunks being written down
        # successes of chunks that still run, to write down together (binding name ->
        # the binding, its items, their outcomes)
        self._early: dict[str, tuple[Binding, list[Item], list[Outcome]]] = {}

    def start(self) -> None:
        """Start the worker tasks on the running loop."""
        self._tasks = [asyncio.create_task(self._work(), name=f"scheduler-worker-{n}")
                       for n in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._watch_saturation(),
                                               name="scheduler-saturation"))

    async def stop(self) -> None:
        """Stop the workers (chunks still queued are not run), then wait (at most
        ``WRITE_DOWN_WAIT_S``) for the write-downs of the chunks that ran."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        if self._writes:
            _, late = await asyncio.wait(set(self._writes), timeout=WRITE_DOWN_WAIT_S)
            if late:
                log.warning("%d chunk(s) that ran were not written down within %gs of "
                            "stopping; their records may run again if read again",
                            len(late), WRITE_DOWN_WAIT_S)

    # -- intake ---------------------------------------------------------------------------

    async def submit(self, binding: Binding, items: list[Item],
                     report: Report | None = None) -> list[Outcome]:
        """Every outcome of ``items`` (all of ``binding``); waits while the queue is full.

        Records are claimed first (:meth:`Admission.claim`): one that already succeeded is
        answered ``ok`` without running, and one still running elsewhere (a copy read again
        after a crash) waits for that run to end, then is answered ``ok`` or runs here.

        With ``report`` (a run stream), ``report(outcomes)`` is called as each chunk
        ends. Each item is a chunk of its own when the binding's timeout is above its
        ``queue_after_s`` (long work: minutes) or when it is not measured yet; otherwise
        chunks are sized from its measured time per item (an item that alone fills the
        chunk target still runs alone), so short items keep their batches. A binding
        with a concurrency cap keeps its usual chunks. The outcomes are returned at the
        end all the same.
        """
        expired, items = split_expired(binding, items, int(time.time() * 1000))
        stamp_deadlines(binding, items)
        deferred, items = defer(binding, items, self.saturation)
        expired += deferred
        if self.breakers is not None:
            parked, items = await self.breakers.admit(binding, items)
            expired += parked
        skipped, items, busy = await self._claim(binding, items)
        skipped = expired + skipped
        if busy:
            metrics.count_run_once(binding.name, "waited", len(busy))
        if report is not None and skipped:
            report(skipped)
        waiting = asyncio.create_task(self._when_free(binding, busy)) if busy else None
        try:
            results = skipped + await self._submit_claimed(binding, items, report)
            if waiting is not None:
                results += await waiting
        finally:
            if waiting is not None:
                waiting.cancel()
        return results

    async def _claim(self, binding: Binding,
                     items: list[Item]) -> tuple[list[Outcome], list[Item], list[Item]]:
        """(``ok`` outcomes of the records already done, records to run, records busy)."""
        if not items:
            return [], items, []
        try:
            codes = await self.admission.claim(binding, items)
            if len(codes) != len(items):
                raise ValueError(f"{len(codes)} claim codes for {len(items)} items")
        except asyncio.CancelledError:
            # The caller went away while the claim was on its way: it may have landed in
            # Redis all the same, and a claim nobody runs would hold back the copy sent
            # again (a claim held by another scheduler, or none, is left as it is).
            self._later(self._finish(binding, items, []))
            raise
        except Exception:
            log.exception("binding %s: could not claim %d record(s); running them without "
                          "the run-once guard", binding.name, len(items))
            return [], items, []
        if codes.count(RUN) == len(codes):
            return [], items, []
        done = [ok(i["id"]) for i, c in zip(items, codes, strict=True) if c == DONE]
        run = [i for i, c in zip(items, codes, strict=True) if c in (RUN, TAKEN_OVER)]
        busy = [i for i, c in zip(items, codes, strict=True) if c == BUSY]
        if done:
            metrics.count_run_once(binding.name, "skipped", len(done))
        taken = codes.count(TAKEN_OVER)
        if taken:
            metrics.count_run_once(binding.name, "taken_over", taken)
            log.warning("binding %s: %d record(s) were claimed by a scheduler that died before "
                        "they ended; they run again here", binding.name, taken,
                        extra={"binding": binding.name})
        return done, run, busy

    async def _when_free(self, binding: Binding, busy: list[Item]) -> list[Outcome]:
        """Outcomes of records running elsewhere: ``ok`` once that run succeeded, or run
        here once it failed or its scheduler died; a held retry (no attempt spent) when
        the other run is still going after the binding's timeout and a grace."""
        results: list[Outcome] = []
        deadline = time.monotonic() + binding.timeout_s + self.busy_grace_s
        pause = BUSY_POLL_FIRST_S
        while busy:
            await asyncio.sleep(pause)
            pause = min(pause * 2, BUSY_POLL_MAX_S)
            done, run, busy = await self._claim(binding, busy)
            results += done
            if run:
                results += await self._submit_claimed(binding, run)
            if busy and time.monotonic() >= deadline:
                log.warning("binding %s: %d record(s) are still running in another scheduler "
                            "after %gs; they come back in %gs without spending an attempt",
                            binding.name, len(busy), binding.timeout_s + self.busy_grace_s,
                            self.admission_retry_s, extra={"binding": binding.name})
                results += [retry(i["id"], "a copy of this record is still running elsewhere",
                                  after_s=self.admission_retry_s, spends_attempt=False)
                            for i in busy]
                break
        return results

    async def _finish(self, binding: Binding, items: Sequence[Item],
                      outcomes: Sequence[Outcome]) -> set[int]:
        """Tell the admission how claimed ``items`` ended (successes are remembered); the
        ids of those that failed here but were done meanwhile by another copy."""
        if not items:
            return set()
        try:
            return await self.admission.finish(binding, items, outcomes)
        except Exception:
            log.exception("binding %s: could not record how %d claimed record(s) ended; a "
                          "copy read again may run again", binding.name, len(items))
            return set()

    async def _submit_claimed(self, binding: Binding, items: list[Item],
                              report: Report | None = None) -> list[Outcome]:
        results: list[Outcome] = []
        futures: list[asyncio.Future[list[Outcome]]] = []
        cap = self._cap(binding)
        admitted = False
        parts: list[list[Item]] | None = None
        queued = 0
        try:
            if _fits_one_burst(binding, len(items)):
                # One admission round trip for the whole batch when the bucket could hand
                # it out at once anyway; chunk by chunk only when the rate limit binds.
                refused, items = await self._admit_or_retry(binding, items)
                results.extend(refused)
                _report_now(report, refused)
                admitted = True
            if report is not None and not cap and binding.timeout_s > binding.queue_after_s:
                parts = [[item] for item in items]  # long work by its timeout: each alone
            else:
                parts = self.sizer.split(binding.name, items, self.workers, cap or 1,
                                         cautious=report is not None)
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
                self._later(self._finish(binding, left, []))
        return results

    def _later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` to its end even though the caller is being cancelled."""
        task = watch(asyncio.ensure_future(coro), "a scheduler background task")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _admit_or_retry(self, binding: Binding,
                              items: list[Item]) -> tuple[list[Outcome], list[Item]]:
        try:
            refused, admitted = await self._admit(binding, items)
        except Exception as exc:
            log.error("binding %s: admission failed (%s); %d item(s) will come back in %gs",
                      binding.name, error_text(exc), len(items), self.admission_retry_s)
            refused = [retry(i["id"], f"admission failed: {error_text(exc)}",
                             after_s=self.admission_retry_s, spends_attempt=False)
                       for i in items]
            admitted = []
        if refused:  # claimed, but not run here: free for the copy that comes back
            ids = {o["id"] for o in refused}
            await self._finish(binding, [i for i in items if i["id"] in ids], refused)
        return refused, admitted

    async def _intake(self, binding: Binding, items: list[Item],
                      admitted_already: bool = False) -> tuple[list[Outcome], Chunk | None]:
        refused: list[Outcome] = []
        if admitted_already:
            admitted = items
        else:
            refused, admitted = await self._admit_or_retry(binding, items)
        if not admitted:
            return refused, None
        chunk = Chunk(binding, admitted, asyncio.get_running_loop().create_future(),
                      deadline=order_key(binding, admitted, time.time(),
                                         self.default_window_s))
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

    def _park_queued(self) -> None:
        """The scheduler has become saturated: take the queued chunks of deferring bindings
        out of the queue and park them now, rather than when a worker reaches them (a chunk
        with a record whose deadline is near stays, and is judged when it leaves)."""
        now_ms = int(time.time() * 1000)
        for chunk in self.queue.remove_where(
                lambda c: may_wait(c.binding, c.items, now_ms)):
            self._later(self._answer(chunk, park(chunk.binding, chunk.items, now_ms)[0]))

    async def _answer(self, chunk: Chunk, outcomes: list[Outcome]) -> None:
        """Answer a chunk that did not run (its claims freed first, as after a run)."""
        await self._finish(chunk.binding, chunk.items, outcomes)
        if not chunk.future.done():
            chunk.future.set_result(outcomes)

    async def _watch_saturation(self, every_s: float = 0.5) -> None:
        """Look at the saturation now and then, so that its gauge and log follow it while
        no batch asks (an idle scheduler stops being saturated)."""
        while True:
            self.saturation.saturated()
            await asyncio.sleep(every_s)

    # -- running --------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            chunk = await self.queue.get()
            metrics.set_queue_depths(self.queue.fair.items_by_tier())
            outcomes: list[Outcome] | None = None
            if not chunk.future.done():  # else its caller went away: it runs when sent again
                self.running_items += chunk.cost
                try:
                    outcomes = await self._run(chunk)
                except Exception as exc:  # a bug here must not lose the items: they come back
                    log.exception("binding %s: a chunk failed in the scheduler",
                                  chunk.binding.name)
                    outcomes = [retry(i["id"], f"scheduler error: {error_text(exc)}",
                                      spends_attempt=False, after_s=self.admission_retry_s)
                                for i in chunk.items]
                finally:
                    self.running_items -= chunk.cost
            self._write_down(chunk, outcomes)

    def _write_down(self, chunk: Chunk, outcomes: list[Outcome] | None) -> None:
        """Write down how ``chunk`` ended (successes done, the rest freed) without holding
        the worker for the round trip, and answer it: at once when every item succeeded
        (its claims stay in Redis until the marks land, so a copy read meanwhile waits
        for them), else once the write landed (a failure here may have succeeded in
        another copy: see :meth:`_done_elsewhere`)."""
        answered = False
        if outcomes is not None and not chunk.future.done() and all(
                o["status"] == "ok" for o in outcomes):
            chunk.future.set_result(outcomes)
            answered = True
        self._track_write(self._finish_chunk(chunk, outcomes, answered))

    def _track_write(self, write: Coroutine[Any, Any, Any]) -> None:
        """Run a write-down beside the workers (the scheduler's stop waits for it)."""
        task = watch(asyncio.ensure_future(write), "a run-once write-down")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def _write_early(self, binding: Binding, written: set[int], items: list[Item],
                     oks: list[Outcome]) -> None:
        """Write down successes of a chunk that still runs (:meth:`Runtime.run_held`):
        those handed over together (by every chunk the runtime looked at) go in one
        write-down per binding."""
        written.update(o["id"] for o in oks)
        if not self._early:
            asyncio.get_running_loop().call_soon(self._flush_early)
        _, pending_items, pending_oks = self._early.setdefault(binding.name, (binding, [], []))
        pending_items += items
        pending_oks += oks

    def _flush_early(self) -> None:
        early, self._early = self._early, {}
        for binding, items, oks in early.values():
            self._track_write(self._finish(binding, items, oks))

    async def _finish_chunk(self, chunk: Chunk, outcomes: list[Outcome] | None,
                            answered: bool) -> None:
        items = chunk.items
        if chunk.written:
            items = [i for i in items if i["id"] not in chunk.written]
        elsewhere = await self._finish(chunk.binding, items, outcomes or [])
        if answered or outcomes is None or chunk.future.done():
            return
        if elsewhere:
            outcomes = self._done_elsewhere(chunk.binding, outcomes, elsewhere)
        chunk.future.set_result(outcomes)

    @staticmethod
    def _done_elsewhere(binding: Binding, outcomes: list[Outcome],
                        elsewhere: set[int]) -> list[Outcome]:
        """``outcomes`` with those of records another copy completed turned ``ok``: this
        scheduler was judged dead while running them, another took them over and they
        succeeded there, so they are done (retrying them would run them again)."""
        metrics.count_run_once(binding.name, "done_elsewhere", len(elsewhere))
        log.warning("binding %s: %d record(s) that failed here had succeeded meanwhile in "
                    "another scheduler, which took them over (this one was judged dead: "
                    "check its link to Redis and its event loop); they are answered ok",
                    binding.name, len(elsewhere), extra={"binding": binding.name})
        return [ok(o["id"]) if o["id"] in elsewhere else o for o in outcomes]

    async def _run(self, chunk: Chunk) -> list[Outcome]:
        binding = chunk.binding
        expired, items = split_expired(binding, chunk.items, int(time.time() * 1000))
        deferred, items = defer(binding, items, self.saturation)
        expired += deferred
        breakers = self.breakers
        if breakers is not None and items and breakers.parks_now(binding):
            expired += breakers.park(binding, [i for i in items if not breakers.is_probe(i)])
            items = [i for i in items if breakers.is_probe(i)]
        if not items:
            return expired
        outcomes = await self._run_items(binding, items, chunk.written)
        if breakers is not None:
            outcomes = await breakers.report(binding, items, outcomes)
        return expired + outcomes

    async def _run_items(self, binding: Binding, items: list[Item],
                         written: set[int] | None = None) -> list[Outcome]:
        """Run ``items``; with ``written``, the successes of a chunk spread over threads
        are written down while it runs, and their ids added to ``written``."""
        try:
            job = self.runtime.job(binding)
        except (ModuleNotAllowed, FunctionNotFound) as exc:
            return [failed(i["id"], str(exc), FUNCTION_ERROR) for i in items]
        started = time.monotonic()
        metrics.observe_record_ages(binding.name, [i["record_time_ms"] for i in items],
                                    time.time())
        cap = self._cap(binding)
        if cap:
            outcomes = await self._run_capped(job, items, cap)
        elif written is not None and not binding.idempotent:
            outcomes = await self.runtime.run(
                job, items, lambda done, oks: self._write_early(binding, written, done, oks))
        else:
            outcomes = await self.runtime.run(job, items)
        took = time.monotonic() - started
        if not cap:
            self.sizer.observe(binding.name, self.runtime.work_s(job, len(items), took),
                               len(items), job.function.is_async,
                               self.runtime.parts(binding.name, len(items)) > 1)
        # Items of a chunk run one after another: each is counted at the chunk's mean.
        metrics.observe_durations(binding.name, [took / len(items)], repeat=len(items))
        self._report(binding, outcomes)
        return outcomes

    def _cap(self, binding: Binding) -> int | None:
        """The binding's concurrency limit now: None without a cap; with one, the adaptive
        (AIMD) limit within it when the admission offers one.

        A binding without a cap is never slowed by its failures: at a 100% failure rate its
        topic must still drain at full speed into the delay topics (docs/design.md, invariant 3).
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
                results.append(await self._run_in_slot(job, item))

        await asyncio.gather(*(lane() for _ in range(min(cap, len(items)))))
        return results

    async def _run_in_slot(self, job: Job, item: Item) -> Outcome:
        """Run one item inside a concurrency slot. A sync call that overran its timeout
        is answered ``timeout`` at once, but its slot is not free until the call returns
        (its thread cannot be stopped): a background task holds it until then."""
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._hold_slot(job, item, answer))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if not answer.done():  # the caller went away before it ended: stop it
                task.cancel()
            raise

    async def _hold_slot(self, job: Job, item: Item, answer: asyncio.Future[Outcome]) -> None:
        try:
            async with self.admission.slot(job.binding):
                outcome, late = await self.runtime.run_one_held(job, item)
                if not answer.done():
                    answer.set_result(outcome)
                if late:
                    await asyncio.gather(*late, return_exceptions=True)
        except Exception as exc:  # the slot could not be had (run_one_held never raises)
            if not answer.done():
                answer.set_result(retry(item["id"], f"admission failed: {error_text(exc)}",
                                        after_s=self.admission_retry_s,
                                        spends_attempt=False))
            else:
                log.exception("binding %s: releasing a concurrency slot failed",
                              job.binding.name)

    def _report(self, binding: Binding, outcomes: list[Outcome]) -> None:
        # the failures counted by reason: bad input says nothing about the downstream's health
        reasons = Counter([o["reason"] for o in outcomes if o["status"] != "ok"])
        good = len(outcomes) - reasons.total()
        bad = reasons.total() - reasons[UNDECODABLE]
        try:
            self.admission.report(binding, good, bad)
        except Exception:
            log.exception("binding %s: admission.report failed", binding.name)

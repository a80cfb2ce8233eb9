"""Running a chunk of one binding's items: async functions on the event loop, sync ones
in a bounded thread pool with ONE thread hop per chunk, or in worker processes for a
binding bound ``--isolation process`` (:mod:`asynctier.scheduler.processes`:
a call past its timeout is stopped, its process killed and replaced).

A sync chunk runs its items one after another in one worker thread (:class:`SyncRun`), so
the per-item cost is a function call, not a thread hand-off; once its binding is measured,
a chunk holding at least :data:`SPREAD_PART_S` of work per part is cut into up to
:data:`SYNC_SPREAD` parts, each such a run in a thread of its own (functions that wait on
I/O overlap). The event loop wakes once per chunk, when its last part ends
(:class:`SyncParts`), or on its timer: when an item in progress passes the binding's
timeout, the loop stops waiting for it (an attempt failed with reason ``timeout``), and
sends the rest of that part on another hop. Python cannot stop a thread, so **an
overrunning sync call keeps its worker thread** until it returns: it is logged (binding
and item), counted
(``asynctier_function_timeouts_total{outcome="left_running"}``,
``asynctier_overrunning_calls``), counted in the scheduler's load, and, for a binding with
a concurrency cap, keeps its slot until it returns (:meth:`Runtime.run_one_held`). A sync
call that returns late (past the timeout) is a ``timeout`` failure too.

A sync function that keeps a worker thread on the CPU holds the GIL the event loop needs
for everything else (urgent work, replies, admission): once its binding is measured
**CPU-bound** (its threads keep at least :data:`CPU_BOUND_SHARE` of a core busy, at
least ``cpu_bound_item_s`` of CPU an item, more than handing an item to a process
costs), its chunks run in worker processes, as if it were bound ``--isolation process``;
it is logged and shown in ``asynctier_binding_in_processes``. ``cpu_bound_item_s=None``
keeps every binding where it was bound.

An async chunk runs its items concurrently on the loop in up to :data:`ASYNC_LANES` lanes
(one task per lane, the first lane in the caller's task) under one timer per chunk
(:class:`AsyncRun`): an item past the binding's timeout is cancelled and fails with reason
``timeout``; the others run on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from asynctier.platform import metrics, tracing
from asynctier.platform.binding import Binding
from asynctier.platform.context import Context
from asynctier.platform.errors import DecodeError
from asynctier.platform.framed import RegistryClients
from asynctier.platform.payloads import Decoder, decoder_for
from asynctier.platform.supervise import RestartPolicy, supervise_task
from asynctier.platform.wire import Item, Outcome, ok
from asynctier.scheduler import outcomes
from asynctier.scheduler.processes import ProcessPool
from asynctier.scheduler.resolver import Function, FunctionResolver
from asynctier.scheduler.work import resumed_of, saver_of, trace_of

log = logging.getLogger(__name__)

#: How long past an item's timeout the loop waits before giving up on its thread.
WATCH_GRACE_S = 0.05
#: Threads one sync chunk may spread over (its items then run that many at a time): the
#: thread pool holds ``threads`` x this, so that functions that wait on I/O overlap.
SYNC_SPREAD = 8
#: A sync chunk is spread only in parts of at least this much measured work each (a
#: thread hop costs tens of microseconds: fast items stay in one thread).
SPREAD_PART_S = 0.004
#: How often the successes of a sync chunk spread over threads are handed over while the
#: chunk still runs (to be written down: a scheduler killed then runs them again).
EARLY_WRITE_S = 0.01
#: Items of one async chunk running at once (the default largest chunk: all of its items
#: start together). An async function's chunks are this large once it is measured
#: (:meth:`~asynctier.scheduler.sizing.ChunkSizer.observe`, ``concurrent``).
ASYNC_LANES = 256
#: The weight of a new run in a binding's time per item (an EWMA).
EWMA_WEIGHT = 0.3
#: A sync binding whose threads, together, keep at least this share of a core busy is
#: CPU-bound: it holds the GIL the event loop needs at least that share of the time (a
#: share of a core, not of each thread's time: threads that wait for the GIL are not on
#: the CPU either).
CPU_BOUND_SHARE = 0.5
#: ... when its items also take at least this much CPU each: handing an item to a worker
#: process costs the loop about this, so quicker functions stay in threads.
CPU_BOUND_ITEM_S = 0.0001
#: The window a binding's CPU time is summed over before it is judged.
CPU_WINDOW_S = 1.0


#: Takes the successes of some items of a chunk that still runs (:meth:`Runtime.run_held`).
Early = Callable[[list[Item], list[Outcome]], None]


@dataclass(frozen=True)
class Job:
    """What running a binding's items needs: the binding, its function, its decoder."""

    binding: Binding
    function: Function
    decode: Decoder
    binding_bytes: bytes = b""  # in worker processes: the binding, for the worker
    cpu_bound: bool = False  # measured CPU-bound: it runs in worker processes

    @property
    def in_process(self) -> bool:
        """True when its items run in worker processes (a sync function, isolated or
        measured CPU-bound)."""
        return ((self.binding.execution.isolation == "process" or self.cpu_bound)
                and not self.function.is_async)


def context_of(binding: Binding, item: Item, deadline: float) -> Context:
    """The ``ctx`` of one item (positional arguments: built once per item, hot path);
    ``ctx.deadline`` is the record's deadline when it has one, else ``deadline``."""
    headers = item["headers"]
    if item["deadline_ms"] is not None:
        deadline = item["deadline_ms"] / 1000.0
    return Context(binding.name, item["key"],
                   tuple((h["name"], h["value"]) for h in headers) if headers else (),
                   item["source_ref"], item["attempt"], item["record_time_ms"] / 1000.0,
                   deadline, binding.tenant, resumed_of(item), saver_of(item), trace_of(item))


class SyncRun:
    """One thread hop: runs ``items`` in order until done or abandoned by the loop."""

    def __init__(self, job: Job, items: Sequence[Item]) -> None:
        self.job = job
        self.items = items
        self.results: list[Outcome] = []
        self.started = 0.0
        self.began = self.ended = 0.0  # when its thread took it up, and finished it
        self.cpu_s = 0.0  # its thread's CPU time while it ran
        self.finished = False  # ended without being abandoned
        self.abandoned = False
        self.error: BaseException | None = None  # raised outside the function: a bug
        self.on_end: Callable[[], None] = _nothing  # called in its thread when finished
        self._lock = threading.Lock()

    def __call__(self) -> None:
        """Run in a worker thread; :attr:`on_end` is called at the end unless the loop
        gave up on this run meanwhile."""
        try:
            self._run()
        except BaseException as exc:  # not the function's (that is an outcome): a bug
            self.error = exc
        with self._lock:
            if self.abandoned:
                return
            self.ended = time.monotonic()
            self.finished = True
        self.on_end()

    def _run(self) -> None:
        """The hot loop of every sync function, so per item one lock: it hands the previous
        item's outcome over and starts the clock of the next, or stops when the loop has
        given up on this run. An item whose outcome is not handed over yet counts as in
        progress for the loop's watch, which gives up on an item only once its timeout has
        passed since it started: such an item is answered ``timed out``, as a late return
        is."""
        job, binding = self.job, self.job.binding
        decode, call = job.decode, job.function.call
        timeout = binding.execution.timeout_s
        monotonic, lock, results = time.monotonic, self._lock, self.results
        wall_offset = time.time() - monotonic()
        self.began = monotonic()
        cpu_began = time.thread_time()
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
                outcome = outcomes.undecodable(item_id, exc)
                continue
            try:
                call(payload, context_of(binding, item, started + wall_offset + timeout))
            except BaseException as exc:  # a function may raise anything, even SystemExit
                outcome = outcomes.of_exception(item_id, exc)
            else:
                outcome = ok(item_id)
            if monotonic() - started > timeout:
                outcome = outcomes.timed_out(item_id, timeout)
        self.cpu_s = time.thread_time() - cpu_began
        with lock:
            if not self.abandoned and outcome is not None:
                results.append(outcome)

    def results_from(self, start: int) -> list[Outcome]:
        """The outcomes handed over so far, from the ``start``-th on (while it runs)."""
        with self._lock:
            return self.results[start:]

    def raise_error(self) -> None:
        """Raise what went wrong outside the function, if anything did."""
        if self.error is not None:
            raise self.error

    def wait_s(self) -> float:
        """Seconds until the item in progress is overdue (a full timeout before any)."""
        timeout = self.job.binding.execution.timeout_s + WATCH_GRACE_S
        with self._lock:
            if self.started == 0.0:
                return timeout
            return max(0.0, self.started + timeout - time.monotonic())

    def abandon_if_overdue(self) -> bool:
        """Give up on the item in progress when it is past its timeout; True if so."""
        with self._lock:
            in_progress = (self.started and not self.finished
                           and len(self.results) < len(self.items))
            timeout_s = self.job.binding.execution.timeout_s
            if in_progress and time.monotonic() - self.started > timeout_s:
                self.abandoned = True
        return self.abandoned


def _nothing() -> None:
    """The end of a run nobody waits for."""


class SyncParts:
    """The parts of one sync chunk, each a :class:`SyncRun` in a pool thread. The loop is
    woken once, by the last part to end (not once per part: a wake-up costs the loop
    more than a part's items do), or by its timer when an item may be overdue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending = 0  # runs started, not finished nor abandoned
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None

    def start(self, pool: ThreadPoolExecutor, run: SyncRun) -> tuple[SyncRun, Future[None]]:
        """Run ``run`` in ``pool``; the run and its thread's future."""
        with self._lock:
            self.pending += 1
        run.on_end = self._ended
        return run, pool.submit(run)

    def abandon_if_overdue(self, run: SyncRun) -> bool:
        """Give up on ``run`` when its item in progress is past its timeout; True if so."""
        if not run.abandon_if_overdue():
            return False
        with self._lock:
            self.pending -= 1
        return True

    async def wait(self, timeout: float) -> None:
        """Until every run started has finished or been given up, or ``timeout`` passed."""
        with self._lock:
            if self.pending == 0:
                return
            self._waiter = waiter = self.loop.create_future()
        await asyncio.wait((waiter,), timeout=timeout)

    def _ended(self) -> None:  # in the run's thread
        with self._lock:
            self.pending -= 1
            waiter = self._waiter if self.pending == 0 else None
        if waiter is not None:
            self.loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Harvest:
    """The successes of a running sync chunk's parts not handed over yet."""

    def __init__(self, items: Sequence[Item], early: Early) -> None:
        self.by_id = {item["id"]: item for item in items}
        self.early = early
        self.runs: list[SyncRun] = []  # the chunk's parts (and those of items left over)
        self.seen: dict[int, int] = {}  # id(run) -> its results handed over

    def take(self) -> None:
        """Hand over what ended in the chunk's parts since the last call."""
        oks: list[Outcome] = []
        for run in self.runs:
            seen = self.seen.get(id(run), 0)
            new = run.results_from(seen)
            self.seen[id(run)] = seen + len(new)
            oks += [o for o in new if o["status"] == "ok"]
        if oks:
            self.early([self.by_id[o["id"]] for o in oks], oks)


class Runtime:
    """Resolves functions and runs chunks; owns the bounded pool of sync worker threads.

    ``threads`` sync chunks run at once (the scheduler's workers); a chunk whose items
    take long enough (:data:`SPREAD_PART_S` of measured time per part) is cut into up to
    ``spread`` parts run in as many threads at once, so the pool holds ``threads * spread``
    threads: a function that waits 1 ms on I/O runs up to 32 at a time by default."""

    def __init__(self, resolver: FunctionResolver, threads: int = 8,
                 processes: int | None = None, spread: int = SYNC_SPREAD,
                 cpu_bound_item_s: float | None = CPU_BOUND_ITEM_S,
                 registries: RegistryClients | None = None) -> None:
        self.resolver = resolver
        #: The schema registries' clients (``[schema_registry]`` settings), shared by the
        #: registry-framed bindings so each writer schema is fetched once.
        self.registries = registries or RegistryClients()
        self.spread = max(1, spread)
        self.threads = threads * self.spread
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="asynctier-fn")
        self.processes = ProcessPool(resolver.allow_modules, processes or threads,
                                     self.registries.config)
        self._jobs: dict[str, Job] = {}
        self._per_item_s: dict[str, float] = {}  # sync bindings: measured seconds per item
        self.cpu_bound_item_s = cpu_bound_item_s
        self._cpu: dict[str, tuple[float, float, int]] = {}  # window: began, CPU s, items
        self.hung_threads = 0
        self._harvests: set[_Harvest] = set()  # running spread chunks with ``early``
        self._harvester: asyncio.Task[None] | None = None
        self._harvest_wanted = asyncio.Event()  # sync chunks spread over threads run
        #: How the harvester restarts after a failure (tests shorten it).
        self.restart_policy: RestartPolicy | None = None

    def job(self, binding: Binding) -> Job:
        """The job of ``binding``; ModuleNotAllowed / FunctionNotFound when refused."""
        job = self._jobs.get(binding.name)
        if job is None or job.binding is not binding:
            function = self.resolver.resolve(binding.function)
            if tracing.enabled():
                from asynctier.scheduler.traces import traced  # OpenTelemetry: only while on

                function = traced(function)
            job = Job(binding, function,
                      decoder_for(binding, self.registries),
                      binding.encode() if binding.execution.isolation == "process" else b"")
            self._jobs[binding.name] = job
        return job

    async def run(self, job: Job, items: Sequence[Item],
                  early: Early | None = None) -> list[Outcome]:
        """Run every item of one chunk; one outcome per item."""
        return (await self.run_held(job, items, early))[0]

    async def run_held(self, job: Job, items: Sequence[Item], early: Early | None = None
                       ) -> tuple[list[Outcome], list[asyncio.Future[None]]]:
        """Run every item of one chunk: the outcomes, and the worker threads of calls
        that overran their timeout and still run (their outcome is ``timeout`` already).
        ``early(items, outcomes)`` is given, every :data:`EARLY_WRITE_S` while a sync
        chunk spread over threads runs, the successes that ended since (they are in the
        outcomes at the end all the same)."""
        if job.function.is_async:
            return await run_async_chunk(job, items), []
        if job.in_process:
            return await self.processes.run(job, items), []
        return await self._run_sync(job, items, early)

    async def run_one(self, job: Job, item: Item) -> Outcome:
        """Run a single item."""
        return (await self.run(job, (item,)))[0]

    async def run_one_held(self, job: Job, item: Item
                           ) -> tuple[Outcome, list[asyncio.Future[None]]]:
        """Run a single item (inside a concurrency slot, which a call that overran its
        timeout keeps until the returned futures are done)."""
        results, late = await self.run_held(job, (item,))
        return results[0], late

    def parts(self, binding: str, count: int) -> int:
        """Threads a sync chunk of ``count`` items of ``binding`` is spread over: one
        until measured, then as many parts of :data:`SPREAD_PART_S` as it holds (up to
        ``spread``)."""
        per_item = self._per_item_s.get(binding)
        if per_item is None or self.spread == 1:
            return 1
        return max(1, min(self.spread, count, int(count * per_item / SPREAD_PART_S)))

    def work_s(self, job: Job, count: int, took: float) -> float:
        """How long a chunk of ``count`` items of ``job`` held its worker by its threads'
        own clocks: a measured sync chunk's items per thread times their time per item,
        without the waits for a free thread and for the busy loop to see the parts end
        (``took``, the wall time, for any other chunk). Sizing chunks from the wall time
        shrank them under load, and small chunks cost more per item: the loop then
        lagged more."""
        per_item = self._per_item_s.get(job.binding.name)
        if job.function.is_async or job.in_process or per_item is None:
            return took
        return per_item * -(-count // self.parts(job.binding.name, count))

    async def _run_sync(self, job: Job, items: Sequence[Item], early: Early | None = None
                        ) -> tuple[list[Outcome], list[asyncio.Future[None]]]:
        """Run ``items`` in :meth:`parts` threads at once; the loop wakes once, when the
        last part ends, unless an item passes its timeout first (then that part is given
        up and the rest of its items go on in a new part). With ``early``, a chunk in
        several parts also wakes every :data:`EARLY_WRITE_S` to hand over the successes
        so far: its items end over the 40 ms its parts run, and a scheduler killed before
        they are written down runs them again."""
        loop = asyncio.get_running_loop()
        count = self.parts(job.binding.name, len(items))
        step = -(-len(items) // count)
        parts = SyncParts(loop)
        running = [parts.start(self.pool, SyncRun(job, items[i:i + step]))
                   for i in range(0, len(items), step)]
        harvest = _Harvest(items, early) if early is not None and count > 1 else None
        if harvest is not None:
            harvest.runs = [run for run, _ in running]
            self._harvests.add(harvest)
            self._ensure_harvester()
        try:
            return await self._watch_parts(job, parts, running, harvest)
        finally:
            if harvest is not None:
                self._harvests.discard(harvest)

    def _ensure_harvester(self) -> None:
        """Wake the harvester (started on first use, on the running loop)."""
        self._harvest_wanted.set()
        if self._harvester is None:
            self._harvester = supervise_task(
                "asynctier-harvester", self._harvest, policy=self.restart_policy,
                what="the early write-downs of sync chunks spread over threads",
                hint="Those chunks' successes are written down when they end meanwhile.",
                on_restart=metrics.count_task_restart)

    async def _harvest(self) -> None:
        """Every :data:`EARLY_WRITE_S` while sync chunks spread over threads run, hand
        over their successes so far (one wake-up for all of them); the loop is supervised
        and sleeps while there are none."""
        while True:
            if not self._harvests:
                self._harvest_wanted.clear()
                await self._harvest_wanted.wait()
            await asyncio.sleep(EARLY_WRITE_S)
            for harvest in list(self._harvests):
                harvest.take()

    async def _watch_parts(self, job: Job, parts: SyncParts,
                           running: list[tuple[SyncRun, Future[None]]],
                           harvest: _Harvest | None
                           ) -> tuple[list[Outcome], list[asyncio.Future[None]]]:
        """Wait for the parts of a sync chunk; give up on an item past its timeout."""
        results: list[Outcome] = []
        late: list[asyncio.Future[None]] = []
        while running:
            await parts.wait(min(run.wait_s() for run, _ in running))
            still = []
            for run, future in running:
                if run.finished:
                    run.raise_error()
                    results.extend(run.results)
                    self._measure(job.binding.name, run)
                    self._judge_cpu(job, run)
                elif not parts.abandon_if_overdue(run):
                    still.append((run, future))
                else:
                    overrunning = asyncio.wrap_future(future)
                    self._count_hung(run, overrunning)
                    late.append(overrunning)
                    results.extend(run.results)
                    stuck = run.items[len(run.results)]
                    results.append(outcomes.timed_out(stuck["id"], job.binding.execution.timeout_s))
                    rest = run.items[len(run.results) + 1:]
                    if rest:
                        still.append(parts.start(self.pool, SyncRun(job, rest)))
                        if harvest is not None:
                            harvest.runs.append(still[-1][0])
            running = still
        return results, late

    def _measure(self, binding: str, run: SyncRun) -> None:
        """Keep the binding's time per item (EWMA) from a run that ended."""
        if not run.items or not run.finished:
            return
        sample = (run.ended - run.began) / len(run.items)
        old = self._per_item_s.get(binding)
        self._per_item_s[binding] = sample if old is None else old + EWMA_WEIGHT * (sample - old)

    def _judge_cpu(self, job: Job, run: SyncRun) -> None:
        """Add a run's CPU time to its binding's window; at the end of a window of
        :data:`CPU_WINDOW_S`, a binding CPU-bound in it runs its next chunks in worker
        processes."""
        if self.cpu_bound_item_s is None or not run.items:
            return
        name = job.binding.name
        began, cpu_s, items = self._cpu.get(name, (run.began, 0.0, 0))
        cpu_s, items = cpu_s + run.cpu_s, items + len(run.items)
        window = run.ended - began
        if window < CPU_WINDOW_S:
            self._cpu[name] = (began, cpu_s, items)
            return
        self._cpu.pop(name, None)
        share, per_item = cpu_s / window, cpu_s / items
        if (share >= CPU_BOUND_SHARE and per_item >= self.cpu_bound_item_s
                and job.binding.execution.isolation == "thread"):
            self._jobs[name] = replace(job, cpu_bound=True, binding_bytes=job.binding.encode())
            metrics.set_in_processes(name, True)
            log.warning("binding %s: %s is CPU-bound (its threads kept %.0f%% of a core busy, "
                        "%.2f ms of CPU an item): in threads it holds the GIL the scheduler's "
                        "loop needs, so its items now run in worker processes at the niceness "
                        "of tier %s. Set [scheduler] cpu_bound_item_ms = 0 to keep CPU-bound "
                        "functions in threads.", name, job.function.path, share * 100,
                        per_item * 1000, job.binding.priority, extra={"binding": name})

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
                    run.job.function.path, binding.execution.timeout_s, self.hung_threads,
                    self.threads, extra=tracing.item_log_fields(binding.name, item))
        started = time.monotonic()

        def back(_: Any) -> None:
            self.hung_threads -= 1
            metrics.add_overrunning(binding.name, -1)
            log.info("binding %s: the overrunning call of item %s returned after %.1fs; its "
                     "thread is free", binding.name, item["source_ref"],
                     binding.execution.timeout_s + time.monotonic() - started)

        future.add_done_callback(back)

    def close(self) -> None:
        """Stop the pool without waiting for late (hung) calls; kill the worker processes;
        stop the harvester."""
        if self._harvester is not None:
            self._harvester.cancel()
            self._harvester = None
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.processes.close()


async def run_async_chunk(job: Job, items: Sequence[Item]) -> list[Outcome]:
    """Run a chunk of an async function in up to :data:`ASYNC_LANES` concurrent lanes."""
    return await AsyncRun(job, items).run()


class AsyncRun:
    """One async chunk: its items in lanes on the loop, under ONE timer for the chunk.

    A lane is a task that runs items one after another; the first lane is the calling
    task itself. Lanes start on demand: when a lane starts an item and no other lane is
    free to take the next, one more lane is started (up to :data:`ASYNC_LANES`), so items
    that wait run at once, while items that never wait (a no-op) all run in the first lane
    without a task each. Each lane notes when its item started; the chunk's one timer fires
    when the earliest running item is due, cancels the lanes whose item is past the
    binding's timeout (that item fails with reason ``timeout``, its lane goes on with the
    next) and is set again for the next item due. Per item this costs a clock read, not
    a timer handle as ``asyncio.timeout`` per item did."""

    def __init__(self, job: Job, items: Sequence[Item]) -> None:
        self.job = job
        self.items = items
        self.timeout = job.binding.execution.timeout_s
        self.results: list[Outcome] = []
        self.next = 0  # index of the next item to start
        self.free = 0  # lanes started and not inside an item
        self.started: list[float] = []  # per lane: loop time its item started; 0.0: none
        self.overdue: list[bool] = []  # per lane: being cancelled for a timeout
        self.tasks: list[asyncio.Task[Any] | None] = []
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = None

    async def run(self) -> list[Outcome]:
        """Every item's outcome (in the order they ended)."""
        self.timer = self.loop.call_at(self.loop.time() + self.timeout, self._expire)
        try:
            await self._lane(self._add_lane(asyncio.current_task()))
            others = [t for t in self.tasks[1:] if t is not None]
            if others:
                await asyncio.gather(*others)
        finally:
            self.timer.cancel()
            for task in self.tasks[1:]:
                if task is not None:
                    task.cancel()
        return self.results

    def _add_lane(self, task: asyncio.Task[Any] | None) -> int:
        self.started.append(0.0)
        self.overdue.append(False)
        self.tasks.append(task)
        self.free += 1
        return len(self.tasks) - 1

    def _spawn(self) -> None:
        """Start one more lane (its task is filled in before it first runs)."""
        n = self._add_lane(None)
        self.tasks[n] = self.loop.create_task(self._lane(n))

    async def _lane(self, n: int) -> None:
        job, timeout, started, results = self.job, self.timeout, self.started, self.results
        binding, decode, call, items = job.binding, job.decode, job.function.call, self.items
        clock = self.loop.time
        wall_offset = time.time() - clock()
        while self.next < len(items):
            item = items[self.next]
            self.next += 1
            item_id = item["id"]
            try:
                payload = decode(item["payload"])
            except DecodeError as exc:
                results.append(outcomes.undecodable(item_id, exc))
                continue
            self.free -= 1
            if not self.free and self.next < len(items) and len(started) < ASYNC_LANES:
                self._spawn()
            started[n] = begun = clock()
            outcome: Outcome | None = None
            try:
                await call(payload, context_of(binding, item, begun + wall_offset + timeout))
            except asyncio.CancelledError:
                if not self.overdue[n]:
                    raise  # the chunk's caller went away
            except BaseException as exc:  # a function may raise anything
                outcome = outcomes.of_exception(item_id, exc)
            finally:
                self.free += 1
            started[n] = 0.0
            if self.overdue[n]:  # cancelled past its timeout (or it ignored the cancel)
                if self._settle(n):
                    raise asyncio.CancelledError  # the caller went away meanwhile too
                outcome = outcomes.timed_out(item_id, timeout)
            results.append(ok(item_id) if outcome is None else outcome)
        self.free -= 1

    def _settle(self, n: int) -> bool:
        """Lane ``n``'s item was cancelled for its timeout: count it, take the cancel back;
        True when the lane was cancelled by someone else as well."""
        self.overdue[n] = False
        metrics.count_timeout(self.job.binding.name, "cancelled")
        task = self.tasks[n]
        return task is not None and task.uncancel() > 0

    def _expire(self) -> None:
        """The timer: cancel the items past their timeout, set it for the next one due."""
        now, timeout, started = self.loop.time(), self.timeout, self.started
        due = 0.0
        for n, begun in enumerate(started):
            if not begun or self.overdue[n]:
                continue
            if now - begun >= timeout:
                task = self.tasks[n]
                if task is not None and not task.done():
                    self.overdue[n] = True
                    task.cancel()
            elif not due or begun < due:
                due = begun
        self.timer = self.loop.call_at((due or now) + timeout, self._expire)

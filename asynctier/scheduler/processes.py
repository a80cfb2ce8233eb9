"""Worker processes for the sync functions of ``--isolation process`` bindings.

A thread cannot be stopped; a process can. Each item of such a binding runs in one of at
most ``size`` worker processes (:mod:`asynctier.scheduler.worker_main`, started on
first use and kept for the next items). Past the binding's timeout the worker is killed
(SIGKILL) and the item is an attempt failed with reason ``timeout``; the next item gets a
fresh worker. A worker that dies on its own (``os._exit``, a crash, the OOM killer) costs
its item one attempt and nothing else: the scheduler goes on.

A worker runs at the niceness of its binding's tier
(:data:`~asynctier.platform.binding.NICENESS`): the kernel shares
the CPU between runnable processes by their niceness' weights, so CPU-bound work of a
lower tier yields the cores to the scheduler's own loop and to urgent work, in about the
tiers' 8:4:1. Workers are kept per niceness (one cannot lower its own).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from asynctier.platform import metrics, tracing
from asynctier.platform.binding import NICENESS
from asynctier.platform.context import encode_checkpoint
from asynctier.platform.errors import CheckpointError
from asynctier.platform.wire import Item, Outcome, retry
from asynctier.scheduler import outcomes
from asynctier.scheduler.frames import CHECKPOINT, LENGTH_BYTES, frame
from asynctier.scheduler.work import resumed_of, saver_of
from asynctier.scheduler.worker_main import REGISTRY_CONFIG_ENV, TRACING_ENV

log = logging.getLogger(__name__)

WORKER_MODULE = "asynctier.scheduler.worker_main"
#: Longest frame a worker may answer with (an outcome is a few hundred bytes).
MAX_ANSWER_BYTES = 1 << 20
#: How long a worker may take to start an item's function (a new worker imports Python,
#: asynctier and the function's module first); the binding's timeout runs from then.
START_TIMEOUT_S = 60.0


class WorkerDied(Exception):
    """The worker process ended while running an item."""


#: A checkpoint a worker's function saved: (kind, state).
Saved = tuple[str, bytes]


class WorkerProcess:
    """One worker process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, allow_modules: Sequence[str], nice: int = 0,
                    registry_config: Mapping[str, str] | None = None) -> WorkerProcess:
        """Start a worker that may run functions of ``allow_modules`` only, ``nice`` above
        the scheduler's niceness; its schema registry clients get ``registry_config`` (in
        its environment, not on its command line: it may hold credentials)."""
        env = None
        if registry_config:
            env = {**os.environ, REGISTRY_CONFIG_ENV: json.dumps(dict(registry_config))}
        if tracing.enabled():  # its functions' runs are spans too
            env = {**(env or os.environ),
                   TRACING_ENV: json.dumps(dataclasses.asdict(tracing.settings()))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", WORKER_MODULE, json.dumps(list(allow_modules)), str(nice),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
        return cls(proc)

    async def send(self, header: bytes, binding: bytes, payload: bytes
                   ) -> Outcome | Saved | None:
        """Send one item; None once its function started, or its outcome when it ended
        before (refused, undecodable). WorkerDied when the process ends."""
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(frame(header) + frame(binding) + frame(payload))
            await stdin.drain()
        except ConnectionError as exc:
            raise WorkerDied(str(exc)) from exc
        return await self.answer()

    async def answer(self) -> Outcome | Saved | None:
        """The next answer: None for "started", a checkpoint (kind, state), or the
        outcome."""
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            size = int.from_bytes(await stdout.readexactly(LENGTH_BYTES), "big")
            if size > MAX_ANSWER_BYTES:
                raise WorkerDied(f"it answered a frame of {size} bytes")
            if size == 0:
                return None
            data = await stdout.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerDied(str(exc)) from exc
        if data[:1] == CHECKPOINT:
            kind, _, state = data[1:].partition(b"\n")
            return kind.decode("ascii", "replace"), state
        answer: Outcome = json.loads(data)
        return answer

    async def reply(self, error: str) -> None:
        """Answer a checkpoint: saved (empty) or why not."""
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(frame(error.encode()))
            await stdin.drain()
        except ConnectionError as exc:
            raise WorkerDied(str(exc)) from exc

    async def kill(self) -> int | None:
        """SIGKILL the process and reap it; its exit code."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        return await self.proc.wait()

    @property
    def pid(self) -> int:
        """The process id."""
        return int(self.proc.pid)


def request_of(item: Item) -> bytes:
    """The JSON frame of one item: its id and its ``ctx`` (bytes in base64)."""
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    resumed = resumed_of(item)
    if resumed is not None:
        data, kind = encode_checkpoint(item["binding"], resumed)
        resumed = {"kind": kind, "data": b64(data)}
    return json.dumps({
        "id": item["id"], "key": b64(item["key"]),
        "headers": [(h["name"], b64(h["value"])) for h in item["headers"]],
        "source": item["source_ref"], "attempt": item["attempt"],
        "record_time": item["record_time_ms"] / 1000.0,
        "resumed": resumed, "checkpoints": saver_of(item) is not None,
        "trace": _traceparent(item) if tracing.enabled() else None,
    }).encode()


def _traceparent(item: Item) -> str | None:
    from asynctier.scheduler.traces import traceparent_of  # OpenTelemetry: only while on

    return traceparent_of(item)


class ProcessPool:
    """At most ``size`` worker processes, started when needed, killed past a timeout."""

    def __init__(self, allow_modules: Iterable[str], size: int = 8,
                 registry_config: Mapping[str, str] | None = None) -> None:
        self.allow_modules = tuple(allow_modules)
        self.registry_config = dict(registry_config or {})
        self.size = size
        self._idle: dict[int, list[WorkerProcess]] = {}  # by niceness
        self._all: set[WorkerProcess] = set()
        self._slots: asyncio.Semaphore | None = None
        self.killed = 0  # workers killed past a timeout (for tests and the log)
        self._closed: list[WorkerProcess] = []

    async def run(self, job: Any, items: Sequence[Item]) -> list[Outcome]:
        """Every item of a chunk, up to ``size`` at once; outcomes in any order."""
        results: list[Outcome] = []
        pending = iter(items)

        async def lane() -> None:
            for item in pending:
                results.append(await self.run_item(job, item))

        await asyncio.gather(*(lane() for _ in range(min(self.size, len(items)))))
        return results

    async def run_item(self, job: Any, item: Item) -> Outcome:
        """One item in a worker process, under the binding's timeout."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        async with self._slots:
            nice = NICENESS.get(job.binding.priority, 0)
            idle = self._idle.setdefault(nice, [])
            worker = idle.pop() if idle else await self._start(nice)
            keep = False
            try:
                outcome, keep = await self._call(job, item, worker)
            finally:
                if keep:
                    idle.append(worker)
                else:
                    self._all.discard(worker)
                    await worker.kill()
            return outcome

    async def _start(self, nice: int) -> WorkerProcess:
        worker = await WorkerProcess.start(self.allow_modules, nice, self.registry_config)
        self._all.add(worker)
        return worker

    async def _exchange(self, job: Any, item: Item, worker: WorkerProcess) -> Outcome:
        """Send the item, wait for its function to start, then for its outcome under the
        binding's timeout (TimeoutError past it)."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):  # a new worker imports first
                outcome: Outcome | Saved | None = await worker.send(
                    request_of(item), job.binding_bytes, item["payload"] or b"")
        except TimeoutError as exc:
            raise WorkerDied(f"it did not start the function within {START_TIMEOUT_S:g}s "
                             "(a module that hangs on import?)") from exc
        if outcome is None:  # the function started: its timeout runs from here
            async with asyncio.timeout(job.binding.execution.timeout_s):
                outcome = await worker.answer()
                while isinstance(outcome, tuple):  # a checkpoint: save it, then go on
                    await worker.reply(await self._save(item, outcome))
                    outcome = await worker.answer()
            if outcome is None:
                raise WorkerDied("it said 'started' twice")
        if isinstance(outcome, tuple):
            raise WorkerDied("it sent a checkpoint before its function started")
        return outcome

    @staticmethod
    async def _save(item: Item, saved: Saved) -> str:
        """Save a worker's checkpoint as a thread's would be; the error to answer."""
        saver = saver_of(item)
        kind, state = saved
        if saver is None or kind not in ("json", "bytes"):
            return (f"binding {item['binding']}: its items cannot be checkpointed here "
                    "(only a queue binding's items keep checkpoints)")
        try:
            await saver.asave(state, kind)
        except CheckpointError as exc:
            return str(exc)
        return ""

    async def _call(self, job: Any, item: Item, worker: WorkerProcess) -> tuple[Outcome, bool]:
        binding = job.binding
        timeout = binding.execution.timeout_s
        try:
            outcome = await self._exchange(job, item, worker)
        except TimeoutError:
            self.killed += 1
            metrics.count_timeout(binding.name, "stopped")
            log.warning("binding %s: item %s (attempt %d) ran past its %gs timeout in worker "
                        "process %d; the process is killed and replaced, and the attempt "
                        "failed (reason timeout)", binding.name, item["source_ref"],
                        item["attempt"], timeout, worker.pid,
                        extra=tracing.item_log_fields(binding.name, item))
            return outcomes.timed_out(item["id"], timeout), False
        except WorkerDied as exc:
            code = await worker.kill()
            log.error("binding %s: the worker process %d running item %s (attempt %d) failed "
                      "(%s; exit code %s); the attempt failed and a new worker takes the next "
                      "item", binding.name, worker.pid, item["source_ref"], item["attempt"],
                      exc, code, extra=tracing.item_log_fields(binding.name, item))
            return retry(item["id"], f"the worker process running it died (exit code "
                                     f"{code}): os._exit, a crash or the OOM killer?"), False
        outcome["id"] = item["id"]
        return outcome, True

    def close(self) -> None:
        """Kill every worker (a call under way gets no answer: its item is sent again)."""
        self._closed = list(self._all)
        for worker in self._closed:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.kill()
        self._all.clear()
        self._idle.clear()

    async def wait_closed(self) -> None:
        """Reap the workers :meth:`close` killed (their pipes close with them)."""
        closed, self._closed = self._closed, []
        for worker in closed:
            await worker.proc.wait()

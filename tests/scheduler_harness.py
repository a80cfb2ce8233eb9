"""Starting a scheduler in-process for tests: on a free port, in its own thread and loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from asynctier.platform.binding import Binding
from asynctier.platform.binding_source import BindingSource, StaticBindings
from asynctier.platform.config import Settings
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.wire import Header, Item, Outcome
from asynctier.scheduler import FunctionResolver, Scheduler, SchedulerOptions, run_scheduler
from asynctier.scheduler.admission import Admission, OpenAdmission
from asynctier.scheduler.gates import GATES, GateFactory
from asynctier.scheduler.guard import Guard
from asynctier.scheduler.limits.tenants import TenantStore
from asynctier.scheduler.runtime import Runtime

ALLOW = ("tests.funcs.basic",)


def item(binding: str, item_id: int, payload: bytes | None = b"{}", attempt: int = 1,
         headers: list[Header] | None = None, key: bytes | None = None) -> Item:
    """One item for ``binding``."""
    return {"id": item_id, "binding": binding, "payload": payload, "key": key,
            "headers": headers or [], "attempt": attempt, "source_ref": f"topic/0/{item_id}",
            "record_time_ms": 1_700_000_000_000 + item_id, "priority": 0,
            "deadline_ms": None}


def items(binding: str, count: int, start: int = 0, payload: bytes = b"{}") -> list[Item]:
    """``count`` items for ``binding`` with ids from ``start``."""
    return [item(binding, start + n, payload) for n in range(count)]


def by_id(outcomes: list[Outcome]) -> dict[int, Outcome]:
    """Outcomes keyed by item id (each id exactly once)."""
    found = {o["id"]: o for o in outcomes}
    assert len(found) == len(outcomes), "an item got two outcomes"
    return found


@dataclass
class Running:
    """A scheduler running in a thread, and a client on it."""

    address: str
    client: SchedulerClient

    def submit(self, batch: list[Item]) -> dict[int, Outcome]:
        """Submit one batch and wait for its outcomes."""
        outcomes = by_id(self.client.submit(batch).result())
        assert set(outcomes) == {i["id"] for i in batch}
        return outcomes


@contextlib.contextmanager
def running_scheduler(settings: Settings, bindings: list[Binding] | BindingSource | None,
                      allow: tuple[str, ...] = ALLOW, options: SchedulerOptions | None = None,
                      admission: Admission | None = None,
                      tenants: TenantStore | None = None,
                      guard: Guard | None = None) -> Iterator[Running]:
    """``run_scheduler`` on ``127.0.0.1:0`` in a thread; stopped (and joined) at the end.
    ``tenants``: where it follows tenants' weights (none: it does not); ``guard``: its
    run-once guard (none: every record runs)."""
    stop = threading.Event()
    ready: queue.Queue[str | BaseException] = queue.Queue()
    source = StaticBindings(bindings) if isinstance(bindings, list) else bindings
    loops: list[asyncio.AbstractEventLoop] = []

    def on_ready(address: str) -> None:  # called on the scheduler's loop
        loops.append(asyncio.get_running_loop())
        ready.put(address)

    def run() -> None:
        try:
            run_scheduler(settings, listen="127.0.0.1:0", allow_modules=allow,
                          admission=admission, stop=stop, ready_callback=on_ready,
                          options=options, bindings=source, tenants=tenants, guard=guard)
        except BaseException as exc:
            ready.put(exc)
            raise

    thread = threading.Thread(target=run, name="test-scheduler", daemon=True)
    thread.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise got
    client = SchedulerClient(lambda: [got], call_timeout_s=120, security=settings.rpc)
    try:
        yield Running(got, client)
    finally:
        client.close()
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), ("the scheduler did not stop within 60 s; every "
                                       "thread's and task's stack:\n" + _stacks(loops))


def _stacks(loops: list[asyncio.AbstractEventLoop]) -> str:
    """Every thread's Python stack, and every task's of the scheduler's loop (to tell where
    a scheduler that does not stop waits)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    threads = [f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
               for ident, frame in sys._current_frames().items()]
    tasks = []
    for task in (t for loop in loops for t in asyncio.all_tasks(loop)):
        tasks.append(f"--- task {task.get_name()}\n" + "".join(
            f"  {f.f_code.co_filename}:{f.f_lineno}, in {f.f_code.co_name}\n"
            for f in _awaiting(task.get_coro())))
    return "\n".join(threads + tasks)


def _awaiting(coro: Any) -> Iterator[Any]:
    """The frames of a suspended coroutine and of the ones it awaits, outermost first
    (``Task.get_stack`` gives the outermost alone, and ``print_stack`` fails on grpc's
    Cython frames, which have no line number)."""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def local_scheduler(bindings: list[Binding], allow: tuple[str, ...] = ALLOW,
                    options: SchedulerOptions | None = None,
                    admission: Admission | None = None, guard: Guard | None = None,
                    gates: Sequence[GateFactory] = GATES) -> Scheduler:
    """A Scheduler without a server, for tests that drive ``process`` on their own loop;
    ``gates``: the order its admission asks its gates in."""
    options = options or SchedulerOptions()
    runtime = Runtime(FunctionResolver(allow), options.threads,
                      cpu_bound_item_s=options.cpu_bound_item_s)
    return Scheduler(StaticBindings(bindings), runtime, admission or OpenAdmission(), options,
                     guard=guard, gates=gates)


def run_async(coro: Any) -> Any:
    """Run a coroutine on a fresh loop."""
    return asyncio.run(coro)

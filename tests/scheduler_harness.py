"""Starting a scheduler in-process for tests: on a free port, in its own thread and loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from asynctier.platform.admission import Admission, OpenAdmission
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.scheduler import (
    FunctionResolver,
    Scheduler,
    SchedulerOptions,
    StaticBindings,
    run_scheduler,
)
from asynctier.platform.scheduler.bindings import BindingSource
from asynctier.platform.scheduler.runtime import Runtime
from asynctier.platform.wire import Header, Item, Outcome

ALLOW = ("tests.funcs.basic",)


def item(binding: str, item_id: int, payload: bytes | None = b"{}", attempt: int = 1,
         headers: list[Header] | None = None, key: bytes | None = None) -> Item:
    """One item for ``binding``."""
    return {"id": item_id, "binding": binding, "payload": payload, "key": key,
            "headers": headers or [], "attempt": attempt, "source_ref": f"topic/0/{item_id}",
            "record_time_ms": 1_700_000_000_000 + item_id}


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
                      admission: Admission | None = None) -> Iterator[Running]:
    """``run_scheduler`` on ``127.0.0.1:0`` in a thread; stopped (and joined) at the end."""
    stop = threading.Event()
    ready: queue.Queue[str | BaseException] = queue.Queue()
    source = StaticBindings(bindings) if isinstance(bindings, list) else bindings

    def run() -> None:
        try:
            run_scheduler(settings, listen="127.0.0.1:0", allow_modules=allow,
                          admission=admission, stop=stop, ready_callback=ready.put,
                          options=options, bindings=source)
        except BaseException as exc:
            ready.put(exc)
            raise

    thread = threading.Thread(target=run, name="test-scheduler", daemon=True)
    thread.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise got
    client = SchedulerClient(lambda: [got], call_timeout_s=120)
    try:
        yield Running(got, client)
    finally:
        client.close()
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), ("the scheduler did not stop within 60 s; every "
                                       "thread's stack:\n" + _stacks())


def _stacks() -> str:
    """Every thread's Python stack (to tell where a scheduler that does not stop waits)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def local_scheduler(bindings: list[Binding], allow: tuple[str, ...] = ALLOW,
                    options: SchedulerOptions | None = None,
                    admission: Admission | None = None) -> Scheduler:
    """A Scheduler without a server, for tests that drive ``process`` on their own loop."""
    return Scheduler(StaticBindings(bindings),
                     Runtime(FunctionResolver(allow), (options or SchedulerOptions()).workers),
                     admission or OpenAdmission(), options)


def run_async(coro: Any) -> Any:
    """Run a coroutine on a fresh loop."""
    return asyncio.run(coro)

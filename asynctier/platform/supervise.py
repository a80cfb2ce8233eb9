"""Supervision: a loop that fails is restarted, with a bounded backoff, and says so.

One helper for every long-running loop of the platform: the tailers of every kind (each in
a thread: :class:`Supervisor`) and the scheduler's background tasks (on its event loop:
:func:`supervise_task`). An exception, or a loop that returns while nobody asked it to
stop, is a failure: it is logged with what failed, the error and what the operator can
do, counted (``on_restart``), and the loop starts again after a backoff that doubles from
``first_s`` to ``max_s``. A run that lasted ``healthy_s`` resets the backoff.

A loop that failed ``failing_after`` times within ``failing_window_s`` is **failing**:
its state says so, with its last error, until a run of it has been healthy for
``healthy_s`` (``asynctier bindings`` shows it; the process is not ready meanwhile).

:class:`Restarts` is the bookkeeping alone, with the clock passed in, so tests move time
by hand. One-shot tasks (a write-down) are not restarted: :func:`watch` logs the error
one of them ends with, which asyncio would otherwise drop.

Every loop supervised in a process is listed by :func:`loops` while it runs (as
prometheus-client's registry lists metrics): the process's status board and its
``/readyz`` read it, so nothing has to be threaded through to them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, replace
from typing import Any

log = logging.getLogger(__name__)

Clock = Callable[[], float]
#: Called once per restart with (the loop's name, the reason: the exception's class name,
#: or ``returned``).
OnRestart = Callable[[str, str], None]

#: States a supervised loop reports.
STARTING, RUNNING, RESTARTING, FAILING, STOPPED = (
    "starting", "running", "restarting", "failing", "stopped")


@dataclass(frozen=True)
class RestartPolicy:
    """How a supervised loop is restarted, and when it counts as failing."""

    first_s: float = 1.0
    max_s: float = 60.0
    healthy_s: float = 60.0
    failing_after: int = 5
    failing_window_s: float = 300.0

    @classmethod
    def parse(cls, text: str) -> RestartPolicy:
        """A policy from ``key=value`` pairs, comma separated (``first_s=0.2,max_s=2``);
        the keys not named keep their defaults. ValueError says what to fix."""
        known = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(f"restarts: {part!r} is not one of "
                                 f"{', '.join(sorted(known))} = a number")
            try:
                changes[key] = int(value) if key == "failing_after" else float(value)
            except ValueError:
                raise ValueError(f"restarts: {key} = {value!r} is not a number") from None
        return replace(cls(), **changes).validate()

    def validate(self) -> RestartPolicy:
        """This policy, or ValueError naming the value out of range."""
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"restarts: give 0 < first_s <= max_s (got {self.first_s:g}, "
                             f"{self.max_s:g})")
        if self.healthy_s <= 0 or self.failing_window_s <= 0 or self.failing_after < 1:
            raise ValueError("restarts: healthy_s and failing_window_s must be above 0, "
                             "failing_after at least 1")
        return self


class Restarts:
    """The restart bookkeeping of one supervised loop: its backoff, state and last error.

    Thread-safe: the loop's thread reports, any thread reads :meth:`status`.
    """

    def __init__(self, name: str, policy: RestartPolicy | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.name = name
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.error = ""
        self.count = 0  # restarts in all
        self._state = STARTING
        self._started: float | None = None
        self._delay = self.policy.first_s
        self._failures: deque[float] = deque()
        self._failing = False
        self._lock = threading.Lock()

    def started(self) -> None:
        """A run begins."""
        with self._lock:
            self._started = self.clock()
            self._state = RUNNING

    def failed(self, error: str) -> float:
        """A run failed with ``error``: the backoff to wait before the next one."""
        with self._lock:
            now = self.clock()
            self._settle(now)
            self._failures.append(now)
            while self._failures[0] < now - self.policy.failing_window_s:
                self._failures.popleft()
            delay, self._delay = self._delay, min(self._delay * 2, self.policy.max_s)
            self._failing = self._failing or len(self._failures) >= self.policy.failing_after
            self.error = error
            self.count += 1
            self._started = None
            self._state = RESTARTING
            return delay

    def stopped(self) -> None:
        """The loop ended for good (it was told to stop)."""
        with self._lock:
            self._state = STOPPED
            self._started = None

    def _settle(self, now: float) -> None:
        """A run healthy for ``healthy_s``: the backoff and the failing state are reset."""
        if self._started is not None and now - self._started >= self.policy.healthy_s:
            self._delay = self.policy.first_s
            self._failures.clear()
            self._failing = False

    @property
    def failing(self) -> bool:
        """Whether the loop keeps failing (see the module's doc)."""
        return self.status()[0] == FAILING

    def status(self) -> tuple[str, str]:
        """(state, last error): the error is given while restarting or failing."""
        with self._lock:
            self._settle(self.clock())
            if self._failing and self._state != STOPPED:
                return FAILING, self.error
            return self._state, self.error if self._state == RESTARTING else ""

    def shown(self) -> str:
        """The status as one line: ``running``, ``failing: <error>``..."""
        state, error = self.status()
        return f"{state}: {error}" if error else state


_LOOPS: dict[str, Restarts] = {}
_LOOPS_LOCK = threading.Lock()


def loops() -> dict[str, Restarts]:
    """The loops supervised in this process now, by name."""
    with _LOOPS_LOCK:
        return dict(_LOOPS)


def failing() -> dict[str, str]:
    """The loops of this process that keep failing, with their status line."""
    return {name: r.shown() for name, r in loops().items() if r.failing}


def _enter(restarts: Restarts) -> None:
    with _LOOPS_LOCK:
        _LOOPS[restarts.name] = restarts


def _leave(restarts: Restarts) -> None:
    with _LOOPS_LOCK:
        if _LOOPS.get(restarts.name) is restarts:
            del _LOOPS[restarts.name]


def describe(exc: BaseException) -> str:
    """An error as one short line: its class and message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _report(restarts: Restarts, exc: BaseException | None, what: str, hint: str,
            on_restart: OnRestart | None) -> float:
    """Count and log one failure; the backoff before the next run."""
    error = "it returned without being told to stop" if exc is None else describe(exc)
    delay = restarts.failed(error)
    if on_restart is not None:
        on_restart(restarts.name, "returned" if exc is None else type(exc).__name__)
    state = "it keeps failing; " if restarts.failing else ""
    log.error("%s failed (%s); %srestarting it in %gs (restart %d). %s", what, error,
              state, delay, restarts.count, hint, exc_info=exc)
    return delay


class Supervisor:
    """Runs ``run(stop)`` in a thread of its own until ``stop`` is set, restarting it
    (after the policy's backoff) when it raises or returns early.

    ``what`` names the loop in the log ("tailer for binding b"); ``hint`` says what the
    operator can do when it fails.
    """

    def __init__(self, name: str, run: Callable[[threading.Event], None],
                 stop: threading.Event, *, what: str, hint: str = "",
                 policy: RestartPolicy | None = None, on_restart: OnRestart | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.run = run
        self.stop = stop
        self.what = what
        self.hint = hint
        self.on_restart = on_restart
        self.restarts = Restarts(name, policy, clock)
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def name(self) -> str:
        """The loop's name (a binding's, or ``delay:30s``...)."""
        return self.restarts.name

    def start(self) -> Supervisor:
        """Start the thread; returns self."""
        self.thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread to end (at most ``timeout_s``)."""
        self.thread.join(timeout_s)

    def _loop(self) -> None:
        _enter(self.restarts)
        try:
            self._turns()
        finally:
            self.restarts.stopped()
            _leave(self.restarts)

    def _turns(self) -> None:
        stop = self.stop
        while not stop.is_set():
            self.restarts.started()
            failure: BaseException | None = None
            try:
                self.run(stop)
            except Exception as exc:
                failure = exc
            if stop.is_set():
                if failure is not None:
                    log.error("%s failed while stopping (%s)", self.what, describe(failure),
                              exc_info=failure)
                break
            if stop.wait(_report(self.restarts, failure, self.what, self.hint,
                                 self.on_restart)):
                break


def supervise_task(name: str, make: Callable[[], Awaitable[None]], *, what: str,
                   hint: str = "", policy: RestartPolicy | None = None,
                   on_restart: OnRestart | None = None,
                   restarts: Restarts | None = None) -> asyncio.Task[None]:
    """A task on the running loop that awaits ``make()`` again and again: after it raises
    or returns, with the policy's backoff. Cancel the task to stop it."""
    book = restarts or Restarts(name, policy)

    async def loop() -> None:
        _enter(book)
        try:
            while True:
                book.started()
                failure: Exception | None = None
                try:
                    await make()
                except Exception as exc:
                    failure = exc
                await asyncio.sleep(_report(book, failure, what, hint, on_restart))
        finally:
            book.stopped()
            _leave(book)

    return asyncio.create_task(loop(), name=name)


def watch(task: asyncio.Future[Any], what: str) -> asyncio.Future[Any]:
    """Log the error ``task`` ends with (a one-shot task nobody awaits); returns it."""
    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and (exc := future.exception()) is not None:
            log.error("%s failed: %s", what, describe(exc), exc_info=exc)
    task.add_done_callback(done)
    return task

"""Runs one tailer thread per binding and follows the bindings topic live.

A new binding gets its tailer within seconds; a removed binding's tailer is told to stop
and finishes its in-flight batch first; a changed binding's tailer is restarted. A paused
binding (:mod:`asynctier.platform.paused`) is treated as removed until it is resumed.

Each tailer runs under a :class:`~asynctier.platform.supervise.Supervisor`: a tailer that
raises (a fatal consume error, a bug) or a binding whose topics cannot be prepared is
started again, a fresh tailer after a bounded backoff, whatever the other bindings do.
Its state is one of the process's supervised loops (``asynctier bindings``, ``/readyz``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.paused import PauseFollower
from asynctier.platform.registry import RegistryFollower
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.supervise import RestartPolicy, Supervisor
from asynctier.tailers import registry
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import Hook, no_hook

log = logging.getLogger(__name__)


#: What the operator reads when a tailer failed.
HINT = ("Its records wait, nothing is lost: what it had not committed is read again. Check "
        "the error above (the broker, the queue's database, the topic; a fatal consume "
        "error is often credentials or a fenced consumer); `asynctier bindings` shows "
        "'failing' once it keeps failing.")


class _Running:
    """One binding's tailer under its supervisor: a fresh tailer each run."""

    def __init__(self, binding: Binding, run: Callable[[threading.Event], None],
                 policy: RestartPolicy) -> None:
        self.binding = binding
        self.stop = threading.Event()
        self.supervisor = Supervisor(binding.name, run, self.stop,
                                     what=f"tailer for binding {binding.name}", hint=HINT,
                                     policy=policy, on_restart=metrics.count_tailer_restart)
        self.thread = self.supervisor.thread


#: How long stopping waits for the tailers in all (``asynctier run`` kills a component that
#: has not exited 60 s after its SIGTERM).
STOP_TIMEOUT_S = 40.0


def _stack(thread: threading.Thread) -> str:
    """Where ``thread`` is now, for the log."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)"


class TailerManager:
    """Keeps exactly one running tailer per binding of the registry."""

    def __init__(self, settings: Settings, client: SchedulerClient,
                 options: TailerOptions | None = None,
                 only: Callable[[Binding], bool] | None = None, hook: Hook = no_hook) -> None:
        self.settings = settings
        self.hook = hook
        self.client = client
        self.options = options or TailerOptions()
        self.only = only
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._bindings: dict[str, Binding] = {}
        self._stopping = threading.Event()
        self.pauses = PauseFollower(settings, lambda _: self._apply(self._bindings))
        self._pause_loop = Supervisor(
            "pauses", self.pauses.run, self._stopping, what="the paused-bindings follower",
            hint="Pauses and resumes wait until it reads Redis again; check Redis.",
            policy=settings.restarts, on_restart=metrics.count_task_restart)
        self.follower = RegistryFollower(settings, self._apply)

    def start(self) -> None:
        """Read the pauses and the bindings and start the tailers of those not paused;
        then follow changes of both."""
        self.pauses.read_once()
        self.follower.start()
        self._pause_loop.start()

    def _apply(self, bindings: dict[str, Binding]) -> None:
        paused = self.pauses.paused
        with self._lock:
            if self._stopping.is_set():
                return
            self._bindings = bindings
            wanted = {k: b for k, b in bindings.items()
                      if (self.only is None or self.only(b)) and k not in paused}
            for name in list(self._running):
                current = self._running[name]
                if name not in wanted or wanted[name] != current.binding:
                    log.info("binding %s %s: stopping its tailer after its in-flight batch",
                             name, "paused" if name in paused else "removed or changed")
                    current.stop.set()
                    current.thread.join()
                    del self._running[name]
            for name, binding in wanted.items():
                if name not in self._running:
                    self._start(binding)

    def _start(self, binding: Binding) -> None:
        running = _Running(binding, lambda stop: self._run(binding, stop),
                           self.settings.restarts)
        self._running[binding.name] = running
        running.supervisor.start()

    def _run(self, binding: Binding, stop: threading.Event) -> None:
        """One run of a binding's tailer: what it needs made first (one binding's topics
        failing never holds the others back), then a fresh tailer until ``stop``."""
        registry.prepare(self.settings, [binding])
        kind = registry.kind_of(binding)
        kind.tailer(self.settings, binding, self.client, self.options, self.hook).run(stop)

    def followed(self) -> dict[str, Binding]:
        """The bindings of the registry this manager tails (``only``), paused ones too."""
        bindings = self.follower.bindings
        return bindings if self.only is None else {
            name: b for name, b in bindings.items() if self.only(b)}

    @property
    def bindings(self) -> list[str]:
        """Names of the bindings whose tailers run."""
        with self._lock:
            return sorted(self._running)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every tailer (each finishes and commits its in-flight batches), waiting at
        most ``timeout_s`` in all: a tailer stuck in the Kafka client (librdkafka can hang
        when a consumer leaves during a rebalance) is left behind, with where it was in
        the log, so that the process still exits; what it did not commit is read again."""
        self._stopping.set()
        self.follower.stop()
        with self._lock:
            for running in self._running.values():
                running.stop.set()
            deadline = time.monotonic() + timeout_s
            for name, running in self._running.items():
                running.thread.join(max(0.0, deadline - time.monotonic()))
                if running.thread.is_alive():
                    log.error("tailer for binding %s did not stop within %gs; going on "
                              "without it (the records it did not commit are read again). "
                              "It was at:\n%s", name, timeout_s, _stack(running.thread))
            self._running.clear()
        self._pause_loop.join(2.0)
        self.pauses.close()

"""Prompt pickup: an enqueue wakes the tailers of its topic through LISTEN/NOTIFY.

An enqueue of items that are ready at once sends one ``NOTIFY`` per topic on channel
:data:`CHANNEL` (payload ``namespace<TAB>topic``) once they are committed (a statement
after the insert's commit, or inside the caller's transaction when it enqueues in one),
so it is delivered when the items are visible. Each process that leases listens once per shard
(:class:`Wakeups`, one connection in a supervised thread) and wakes the tailers of that
topic, which lease at once instead of at their next poll.

A notification is a hint, never the only way: one lost (the listener reconnecting, the
server restarted) costs the tailer's bounded poll (``IDLE_POLL_S``), and items that
become ready later (a delay running out, a nack, a released child) are found by that poll.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import psycopg

from asynctier.platform import metrics
from asynctier.platform.supervise import RestartPolicy, Supervisor

log = logging.getLogger(__name__)

#: The notification channel of ready items.
CHANNEL = "asynctier_queue"
#: How long the listener waits for a notification before it checks whether to stop.
LISTEN_TICK_S = 1.0
#: How long the listener's connection may take to open.
CONNECT_TIMEOUT_S = 5


def notify_key(namespace: str, topic: str) -> str:
    """A notification's payload for ``topic`` of ``namespace``."""
    return f"{namespace}\t{topic}"


class Wakeups:
    """The ready-item notifications of shard ``name``, handed to the tailers that
    subscribed to a (namespace, topic); :meth:`start` listens in a supervised thread
    until :meth:`stop`, on the host ``dsn()`` names when it (re)connects (the primary: a
    failover breaks the connection, and the listener reconnects to the new one)."""

    def __init__(self, name: str, dsn: Callable[[], str]) -> None:
        self.name = name
        self.dsn = dsn
        self._wakes: dict[str, set[Callable[[], None]]] = defaultdict(set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: Supervisor | None = None
        #: How the listener restarts after its connection fails (tests shorten it).
        self.policy: RestartPolicy | None = None
        #: Whether the listener is connected and listening now.
        self.listening = False

    @property
    def restarts(self) -> int:
        """How many times the listener was restarted after a failure."""
        return 0 if self._supervisor is None else self._supervisor.restarts.count

    def subscribe(self, namespace: str, topic: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever items of ``topic`` of ``namespace`` become ready (from the
        listener's thread: it must return at once, as ``Event.set`` does)."""
        with self._lock:
            self._wakes[notify_key(namespace, topic)].add(wake)

    def unsubscribe(self, namespace: str, topic: str, wake: Callable[[], None]) -> None:
        """Stop calling ``wake``."""
        with self._lock:
            key = notify_key(namespace, topic)
            self._wakes[key].discard(wake)
            if not self._wakes[key]:
                del self._wakes[key]

    def start(self) -> Wakeups:
        """Listen in a supervised thread; returns self."""
        self._supervisor = Supervisor(
            f"queue-wakeups:{self.name}", self._listen, self._stop,
            what=f"the queue wake-up listener of shard {self.name}",
            hint="Until it is back, queue tailers find new items by their poll (every "
                 "100 ms): check that the shard answers.", policy=self.policy,
            on_restart=metrics.count_task_restart).start()
        return self

    def stop(self) -> None:
        """Stop listening (the thread ends within :data:`LISTEN_TICK_S`)."""
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(LISTEN_TICK_S + CONNECT_TIMEOUT_S)

    def _listen(self, stop: threading.Event) -> None:
        with psycopg.connect(self.dsn(), autocommit=True,
                             connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.listening = True
            try:
                self._wake_all()  # what was enqueued while nobody listened
                while not stop.is_set():
                    for note in conn.notifies(timeout=LISTEN_TICK_S):
                        with self._lock:
                            wakes = list(self._wakes.get(note.payload, ()))
                        for wake in wakes:
                            wake()
            finally:
                self.listening = False

    def _wake_all(self) -> None:
        with self._lock:
            wakes = [w for group in self._wakes.values() for w in group]
        for wake in wakes:
            wake()


_SHARED: dict[str, tuple[Wakeups, int]] = {}
_SHARED_LOCK = threading.Lock()


def acquire(name: str, dsn: Callable[[], str]) -> Wakeups:
    """The process's listener of shard ``name``, started on first use (one connection per
    shard, whatever the number of tailers); give it back with :func:`release`."""
    with _SHARED_LOCK:
        found, users = _SHARED.get(name, (None, 0))
        if found is None:
            found = Wakeups(name, dsn).start()
        _SHARED[name] = (found, users + 1)
        return found


def release(wakeups: Wakeups) -> None:
    """One user less of ``wakeups``; the last one stops it."""
    with _SHARED_LOCK:
        found, users = _SHARED.get(wakeups.name, (None, 0))
        if found is not wakeups:
            return
        if users > 1:
            _SHARED[wakeups.name] = (found, users - 1)
            return
        del _SHARED[wakeups.name]
    wakeups.stop()

"""Stopping a process cleanly: SIGTERM and SIGINT set a stop event, and the main thread
waits for it in a way that lets the handler run."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("asynctier.run")

#: How often a waiting main thread wakes up. A signal can land on another thread of the
#: process (gRPC's, for one); Python then runs its handler in the main thread only at its
#: next bytecode, which an untimed wait never reaches: a tailer process sat through
#: SIGTERM, idle, for a minute.
MAIN_WAKE_S = 0.5


def stop_on_signals(stop: threading.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT (a second one exits at once); on SIGUSR1, print
    every thread's stack to stderr (``kill -USR1 <pid>``: where a process that does not
    stop is stuck; written from the signal handler itself, so it works even while a thread
    holds the interpreter in C code)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s received: finishing in-flight work, then exiting",
                 signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def wait_for_stop(stop: threading.Event, turn: Callable[[], None] | None = None) -> None:
    """Block the main thread until ``stop`` is set, waking every :data:`MAIN_WAKE_S` (and
    calling ``turn`` then: the process's liveness, see :mod:`asynctier.platform.health`)."""
    while not stop.wait(MAIN_WAKE_S):  # see MAIN_WAKE_S
        if turn is not None:
            turn()

"""The event loop of the scheduler and Submitter processes: uvloop, where it is installed.

Both spend much of their CPU in the loop's own machinery (timers, callbacks, the wake-ups
of the tasks that run items and wait on Redis and gRPC), which uvloop does in C: the
drains are faster with it (bench/RESULTS.md, "Event loop").

``ASYNCTIER_EVENT_LOOP=asyncio`` runs the standard library's loop instead (to tell a
problem of uvloop's apart); the loop's clock (``loop.time()``) is then finer than
uvloop's milliseconds, which nothing here depends on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from asynctier.platform.errors import ConfigError

T = TypeVar("T")

#: The environment variable that chooses the loop: ``uvloop`` (the default) or ``asyncio``.
ENV = "ASYNCTIER_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


def chosen() -> str:
    """The loop this process runs: ``uvloop`` unless told ``asyncio`` (or uvloop is not
    installed: there is none for Windows)."""
    choice = os.environ.get(ENV, "uvloop").strip().lower() or "uvloop"
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={os.environ[ENV]!r}: expected one of {', '.join(CHOICES)}")
    if choice == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return "asyncio"
    return choice


def name() -> str:
    """The kind of the running loop: ``uvloop`` or ``asyncio``."""
    kind = type(asyncio.get_running_loop()).__module__
    return "uvloop" if kind.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new loop of the chosen kind, as ``asyncio.run`` does."""
    try:
        kind = chosen()
    except ConfigError:
        main.close()
        raise
    if kind == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)

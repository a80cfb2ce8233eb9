"""A test-only fault hook: kill this process with SIGKILL, or hang the calling thread, at a
named point of the tailer.

It does nothing unless the environment variable ``ASYNCTIER_FAULT`` is set, as
``<kill|hang>-<point>:after=N`` (the N-th time the point is reached, N >= 1), for example
``ASYNCTIER_FAULT=kill-before-commit:after=3``. The fault-injection tests
(``tests/faults``) use it to crash a tailer at an exact place instead of timing a kill:

* ``before-rpc``: a batch was read and is about to be submitted to a scheduler;
* ``mid-batch``: a batch was submitted and the scheduler is running it;
* ``before-commit``: every outcome of a batch is resolved (hand-offs confirmed), its
  offsets are not committed yet;
* ``close``: the tailer is stopping and closes its consumer (``hang-close`` plays
  librdkafka's ``close()`` that never returns).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)

ENV = "ASYNCTIER_FAULT"
POINTS = ("before-rpc", "mid-batch", "before-commit", "close")
ACTIONS = ("kill", "hang")


class FaultHook:
    """Kills the process (or hangs the thread) at ``point`` the ``after``-th time it is
    reached; else a no-op."""

    def __init__(self, point: str | None = None, after: int = 1, action: str = "kill") -> None:
        self.point = point
        self.after = after
        self.action = action
        self.reached_count = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FaultHook:
        """The hook ``$ASYNCTIER_FAULT`` asks for (a no-op hook when unset or malformed)."""
        spec = (os.environ if env is None else env).get(ENV, "").strip()
        if not spec:
            return cls()
        where, _, options = spec.partition(":")
        action, _, point = where.partition("-")
        after = options.removeprefix("after=")
        if action not in ACTIONS or point not in POINTS or not after.isdigit():
            log.error("%s=%r is not understood (<%s>-<%s>:after=N); ignored", ENV, spec,
                      "|".join(ACTIONS), "|".join(POINTS))
            return cls()
        log.warning("fault injection armed: %s at %s, time %s", action, point, after)
        return cls(point, max(int(after), 1), action)

    def reached(self, point: str) -> None:
        """Call at ``point``; kills the process with SIGKILL, or blocks this thread for
        good, when the hook says so."""
        if self.point != point:
            return
        self.reached_count += 1
        if self.reached_count < self.after:
            return
        if self.action == "hang":
            log.critical("fault injection: hanging at %s (time %d)", point, self.reached_count)
            threading.Event().wait()
        else:
            log.critical("fault injection: SIGKILL at %s (time %d)", point, self.reached_count)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)

"""A test-only fault hook: kill this process with SIGKILL, hang the calling thread, or
raise in it, at a named point of the tailer.

It does nothing unless the environment variable ``ASYNCTIER_FAULT`` is set, as
``<action>-<point>:after=N[,times=K]`` (the N-th time the point is reached, N >= 1, and
for ``raise`` and ``fatal`` the K-1 times after it too), for example
``ASYNCTIER_FAULT=kill-before-commit:after=3``. The fault-injection tests
(``tests/faults``) use it to crash a tailer at an exact place instead of timing a kill,
and the supervision tests to make a tailer fail:

* ``kill``: SIGKILL the process; ``hang``: block the thread for good;
* ``raise``: raise :class:`InjectedFault` (a bug in the tailer);
* ``fatal``: a fatal Kafka consume error, through the tailer's own consume-error path.

The points:

* ``read``: the tailer is about to read a batch (Kafka, delay or queue);

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
POINTS = ("read", "before-rpc", "mid-batch", "before-commit", "close")
ACTIONS = ("kill", "hang", "raise", "fatal")


class InjectedFault(RuntimeError):
    """What ``raise-<point>`` raises: an error the tailer does not expect."""


class FaultHook:
    """Kills the process (hangs the thread, raises) at ``point`` the ``after``-th time it
    is reached (and the ``times - 1`` times after, for ``raise`` and ``fatal``); else a
    no-op."""

    def __init__(self, point: str | None = None, after: int = 1, action: str = "kill",
                 times: int = 1) -> None:
        self.point = point
        self.after = after
        self.action = action
        self.times = times
        self.reached_count = 0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FaultHook:
        """The hook ``$ASYNCTIER_FAULT`` asks for (a no-op hook when unset or malformed)."""
        spec = (os.environ if env is None else env).get(ENV, "").strip()
        if not spec:
            return cls()
        where, _, options = spec.partition(":")
        action, _, point = where.partition("-")
        values = dict(part.partition("=")[::2] for part in options.split(","))
        after, times = values.get("after", ""), values.get("times", "1")
        if (action not in ACTIONS or point not in POINTS or not after.isdigit()
                or not times.isdigit() or set(values) - {"after", "times"}):
            log.error("%s=%r is not understood (<%s>-<%s>:after=N[,times=K]); ignored", ENV,
                      spec, "|".join(ACTIONS), "|".join(POINTS))
            return cls()
        log.warning("fault injection armed: %s at %s, time %s (%s times)", action, point,
                    after, times)
        return cls(point, max(int(after), 1), action, max(int(times), 1))

    def reached(self, point: str) -> None:
        """Call at ``point``; kills the process with SIGKILL, blocks this thread for good,
        or raises, when the hook says so."""
        if self.point != point:
            return
        with self._lock:  # the tailers of several bindings share the hook
            self.reached_count += 1
            count = self.reached_count
        if not self.after <= count < self.after + (
                self.times if self.action in ("raise", "fatal") else 1 << 62):
            return
        if self.action == "raise":
            log.critical("fault injection: raising at %s (time %d)", point, count)
            raise InjectedFault(f"fault injection at {point} (time {count})")
        if self.action == "fatal":
            from confluent_kafka import KafkaError

            from asynctier.platform.kafka import consume_error

            consume_error(KafkaError(KafkaError._FATAL, f"fault injection at {point} "
                                     f"(time {count})", fatal=True), "fault injection", point)
            return  # not reached: a fatal error raises
        if self.action == "hang":
            log.critical("fault injection: hanging at %s (time %d)", point, count)
            threading.Event().wait()
        else:
            log.critical("fault injection: SIGKILL at %s (time %d)", point, count)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)

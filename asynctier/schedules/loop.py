"""The schedule loop: fire due ticks on every shard, again and again, until stopped.

Any number of processes run it (each ``asynctier run tailers``, or ``asynctier schedule
run``); they need no leader and no coordination beyond the row locks of
:func:`~asynctier.schedules.fire.fire_due`. It runs under a
:class:`~asynctier.platform.supervise.Supervisor`: a round that fails (a shard down) is
logged and the loop restarted after the policy's backoff; the other shards' schedules are
fired meanwhile by the other processes, or by this one once it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from asynctier.platform import metrics
from asynctier.platform.config import Settings
from asynctier.platform.errors import QueueUnavailable
from asynctier.platform.supervise import Supervisor
from asynctier.queue.route import ShardRoute
from asynctier.queue.shards import ShardedQueue
from asynctier.schedules.fire import Round, fire_due, next_due_in_s
from asynctier.schedules.relay import KafkaRelay

log = logging.getLogger(__name__)

#: How often an idle loop looks for due ticks at most: the bound on a tick's lateness
#: while healthy, beside the statement's own time.
POLL_S = 0.2
#: An offset between this process's clock and the database's above this is logged.
CLOCK_WARN_S = 1.0
#: How long a stopping process waits for its Kafka relays' round under way: not long, a
#: round cut off (its commit made, its ack not) is acked by the next relay's recovery.
STOP_RELAY_S = 2.0


def start_relays(settings: Settings, queue: ShardedQueue, stop: threading.Event
                 ) -> list[Supervisor]:
    """The Kafka relay of every shard (:mod:`asynctier.schedules.relay`), each under a
    supervisor, beside this process's schedule loop; each waits for its shard's lock."""
    return [Supervisor(f"kafka-relay:{route.name}", KafkaRelay(settings, route).run, stop,
                       what=f"the Kafka relay of Kafka-target schedules on shard {route.name}",
                       hint="Their ticks wait in the outbox queue topic, nothing is lost; "
                            "check that Kafka and the shard answer.",
                       policy=settings.restarts,
                       on_restart=metrics.count_task_restart).start()
            for route in queue.routes]


class ScheduleLoop:
    """Fires the due ticks of every shard of ``queue`` every ``poll_s`` at most (sooner
    when the next tick is nearer). ``clock`` is this process's wall clock: used only to
    report its offset from the database's, never to decide what is due. ``namespaces``:
    fire only those tenants' schedules (None: all; a deployment per tenant group)."""

    def __init__(self, queue: ShardedQueue, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.time,
                 on_round: Callable[[Round], None] | None = None,
                 namespaces: Sequence[str] | None = None) -> None:
        self.queue = queue
        self.namespaces = None if namespaces is None else tuple(namespaces)
        self.poll_s = poll_s
        self.clock = clock
        self.on_round = on_round
        self._warned = False
        self._reached: set[str] = set()
        self._waiting: set[str] = set()

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop``; a failing shard raises (the supervisor restarts)."""
        log.info("schedule loop running: firing the due ticks of %s on %d shard(s), every "
                 "%.0f ms at most", ", ".join(self.namespaces) if self.namespaces
                 else "every namespace", len(self.queue.routes), self.poll_s * 1000)
        while not stop.is_set():
            for route in self.queue.routes:
                done = self._round(route)
                if done is not None:
                    self.observe(done)
            stop.wait(self._pause())

    def _round(self, route: ShardRoute) -> Round | None:
        """One firing on one shard. A shard never reached since this process started is
        waited for quietly (a deployment without the queue runs no schedules, and its
        tailers stay ready); one that answered before and fails now raises."""
        try:
            done = route.call(lambda store: fire_due(store, namespaces=self.namespaces))
        except QueueUnavailable:
            if route.name in self._reached:
                raise
            if route.name not in self._waiting:
                log.info("schedule loop: queue shard %s does not answer; no schedules fire "
                         "there until it does", route.name)
                self._waiting.add(route.name)
            return None
        self._reached.add(route.name)
        return done

    def observe(self, done: Round) -> None:
        """Metrics (and the hook) for one round's firings."""
        for _name, _tick, lateness_s in done.fired:
            metrics.SCHEDULE_LATENESS.observe(max(0.0, lateness_s))
        if done.fired:
            metrics.SCHEDULE_FIRINGS.labels("fired").inc(len(done.fired))
        if done.skipped:
            metrics.SCHEDULE_FIRINGS.labels("skipped").inc(done.skipped)
        if done.now_ms:
            self._clock_offset(self.clock() - done.now_ms / 1000.0)
        if self.on_round is not None:
            self.on_round(done)

    def _clock_offset(self, offset_s: float) -> None:
        metrics.SCHEDULE_CLOCK_OFFSET.set(offset_s)
        if abs(offset_s) > CLOCK_WARN_S and not self._warned:
            log.warning("this process's clock is %+.1fs off the queue database's: schedules "
                        "still fire by the database's clock, but fix the host's time sync "
                        "(NTP) so its logs agree", offset_s)
        self._warned = abs(offset_s) > CLOCK_WARN_S

    def _pause(self) -> float:
        """Until the earliest next tick of any shard reached, at most ``poll_s``."""
        waits = [route.call(lambda store: next_due_in_s(store, self.namespaces))
                 for route in self.queue.routes if route.name in self._reached]
        return min([self.poll_s, *(w for w in waits if w is not None)])

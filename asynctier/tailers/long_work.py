"""Long work: a leased source's items accepted at once, each resolved as it ends.

The rule (docs/design.md, Long work): **every queue binding runs here**. A queue item may
run for minutes, so no call waits on the slowest item of a batch. The loop, in the tailer's
thread:

1. Lease what there is room for (at most ``batch_size * max_in_flight`` items running)
   and open a run stream (:mod:`asynctier.platform.stream`) per leased batch, with the
   checkpoint each item resumes from.
2. Take the streams' messages as they come: ``outcomes`` are resolved at once (ack, nack,
   dead item: one transaction for all that arrived together); ``alive`` extends the leases
   of the items named when a third of the lease is spent; ``checkpoint`` is stored on the
   item's row and confirmed back (``saved``).
3. An item whose lease runs out here (no heartbeat came: its scheduler hung or died) is
   dropped: it is leased again once its lease has run out in the database, and resumes
   from its last checkpoint. A stream that broke (the scheduler died) is the same for
   every item it held; one that never reached a scheduler gives its items back at once,
   no attempt spent.

On stop, leasing stops; the items running get :data:`STOP_GRACE_S` to end, and those still
running then are given back (no attempt spent, checkpoints kept).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from asynctier.platform import metrics
from asynctier.platform.errors import AsynctierError, HandoffError
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.stream import Event, Message, StreamCall, items_message
from asynctier.platform.wire import Outcome, retry
from asynctier.queue.items import Leased
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import Hook
from asynctier.tailers.source import LeaseSource

log = logging.getLogger(__name__)

#: The metrics' component of a queue tailer (the same as a Kafka binding's tailer).
COMPONENT = "tailer"
#: A lease is extended when less than this share of it is left.
EXTEND_WHEN_LEFT = 2 / 3

#: How long a stopping tailer waits for the items running to end.
STOP_GRACE_S = 10.0
#: A leased batch that reached no scheduler comes back after this (no attempt spent).
NO_SCHEDULER_RETRY_S = 1.0
#: Heartbeats asked of the scheduler per lease (a third of it spent is when it is extended).
BEATS_PER_LEASE = 4
#: How long the loop waits for a message when nothing else is to be done.
EVENT_WAIT_S = 0.05


@dataclass
class Run:
    """One item running: its lease, the stream it runs on, when its lease ends here."""

    item: Leased
    call: StreamCall
    expires_ms: float
    started: float


Pair = tuple[Leased, Outcome]


class LongWork:
    """Runs one :class:`~asynctier.tailers.source.LeaseSource`'s items on run streams (see
    the module's doc): a queue binding's."""

    def __init__(self, source: LeaseSource, client: SchedulerClient, options: TailerOptions,
                 hook: Hook) -> None:
        self.source = source
        self.client = client
        self.options = options
        self.hook = hook
        self.binding = source.binding
        self.running: dict[str, Run] = {}  # in the order they started
        #: The streams' messages, and None when the source has items ready (a wake-up).
        self.events: queue.Queue[Event | None] = queue.Queue()
        self.unresolved: list[Pair] = []  # outcomes whose write failed: written again
        self.max_running = options.batch_size * options.max_in_flight
        self._retry_at = 0.0
        source.on_ready(lambda: self.events.put(None))

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Lease, run and resolve until ``stop`` is set; then :meth:`finish`."""
        while not stop.is_set():
            self.step()
        self.finish()

    def step(self, lease: bool = True) -> None:
        """One turn: lease if there is room, take the messages, drop expired leases. With
        nothing running the lease is where the loop waits (for a wake-up or the source's
        poll); with items running it waits for their messages or a wake-up."""
        if lease:
            self._lease()
        self.handle(self._take(EVENT_WAIT_S if self.running or not lease else 0.0))
        self._expire()
        self._write_unresolved()
        self._gauges()

    def finish(self) -> None:
        """Give the items running :data:`STOP_GRACE_S` to end, then give the rest back."""
        deadline = time.monotonic() + STOP_GRACE_S
        while self.running and time.monotonic() < deadline:
            self.step(lease=False)
        left = list(self.running.values())
        if left:
            log.warning("binding %s: stopping with %d item(s) still running; they are given "
                        "back (no attempt spent, checkpoints kept) and run again",
                        self.binding.name, len(left))
            for call in {run.call for run in left}:
                call.cancel()
            self.running.clear()
            self._resolve([(run.item, retry(0, "the tailer stopped while it ran", 0.0,
                                            spends_attempt=False)) for run in left])
        self._write_unresolved(force=True)
        self._gauges()

    # -- leasing and sending --------------------------------------------------------------

    def _lease(self) -> None:
        room = self.max_running - len(self.running)
        if room <= 0:
            return
        wait_s = 0.0 if self.running else self.options.idle_poll_s
        self.hook("read")
        leased = self.source.read(min(room, self.options.batch_size), wait_s)
        while leased:
            leased = self._send(leased)

    def _send(self, leased: list[Leased]) -> list[Leased]:
        """Open a run stream for what fits one call; returns the rest."""
        prepared = self.source.prepare(leased)
        if prepared.request is None:
            return prepared.rest
        items: list[Leased] = prepared.records
        resume = {at: (item.checkpoint_kind or "bytes", item.checkpoint)
                  for at, item in enumerate(items) if item.checkpoint is not None}
        beat_s = self.binding.source.lease_s / BEATS_PER_LEASE
        self.hook("before-rpc")
        call = self.client.open_stream(items_message(prepared.request, resume, beat_s),
                                       items, self.events)
        if call is None:  # no scheduler: back in a second, no attempt spent
            self._give_back(items, "no scheduler is registered")
            self.source.stop.wait(NO_SCHEDULER_RETRY_S)
            return []
        metrics.count_batch(COMPONENT, self.binding.name)
        started = time.monotonic()
        for item in items:
            self.running.pop(item.id, None)  # (leased again: it moves to the end)
            self.running[item.id] = Run(item, call, float(item.lease_expires_ms), started)
        return prepared.rest

    # -- messages -------------------------------------------------------------------------

    def _take(self, wait_s: float) -> list[Event | None]:
        """The messages there are (waiting at most ``wait_s`` for the first)."""
        try:
            got = [self.events.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while True:
            try:
                got.append(self.events.get_nowait())
            except queue.Empty:
                return got

    def handle(self, events: Iterable[Event | None]) -> None:
        """Act on the messages, in order; outcomes and lease extensions are batched (a
        wake-up is for the next lease)."""
        done: list[Pair] = []
        alive: list[Run] = []
        for event in events:
            if event is None:
                continue
            call, message = event
            kind = message.kind
            if kind == "outcomes":
                done += self._ended(call, message.outcomes)
            elif kind == "alive":
                alive += [run for i in message.ids if (run := self._run_of(call, i))]
            elif kind == "checkpoint":
                self._checkpoint(call, message)
            elif kind == "end":
                done += self._stream_ended(call, message)
        if done:
            self._resolve(done)
        if alive:
            self._extend(alive)

    def _run_of(self, call: StreamCall, position: int) -> Run | None:
        """The run of item ``position`` of ``call``, while it is still ours on that call."""
        if not 0 <= position < len(call.items):
            return None
        run = self.running.get(call.items[position].id)
        return run if run is not None and run.call is call else None

    def _ended(self, call: StreamCall, outcomes: Sequence[Outcome]) -> list[Pair]:
        pairs = []
        for outcome in outcomes:
            run = self._run_of(call, outcome["id"])
            if run is not None:  # else its lease was lost here: the outcome is ignored
                del self.running[run.item.id]
                pairs.append((run.item, outcome))
        return pairs

    def _stream_ended(self, call: StreamCall, message: Message) -> list[Pair]:
        left = [run for run in self.running.values() if run.call is call]
        if not left:
            return []
        for run in left:
            del self.running[run.item.id]
        if not message.error:  # ended cleanly yet said nothing of these: unknown, retried
            log.error("scheduler %s ended a run stream with %d item(s) unanswered; they are "
                      "retried", call.address, len(left))
            return [(run.item, retry(0, "the scheduler returned no outcome for this item"))
                    for run in left]
        self.client.stream_failed(call, message.code, message.error)
        if not call.accepted:
            log.warning("binding %s: scheduler %s could not take %d item(s) (%s); they are "
                        "given back and sent again", self.binding.name, call.address,
                        len(left), message.error)
            self._give_back([run.item for run in left], message.error)
            return []
        metrics.count_leases_lost(self.binding.name, "stream_broke", len(left))
        log.warning("binding %s: the run stream to scheduler %s broke with %d item(s) running "
                    "(%s: did it die?); they run again once their leases run out (%gs), from "
                    "their last checkpoint", self.binding.name, call.address, len(left),
                    message.error, self.binding.source.lease_s)
        return []

    def _checkpoint(self, call: StreamCall, message: Message) -> None:
        """Store a checkpoint on the item's row, then confirm it (or say why not)."""
        run = self._run_of(call, message.item)
        error = ""
        if run is None:
            error = "this item's lease was lost (it runs again elsewhere)"
        else:
            try:
                held = self.source.save_checkpoint(run.item.id, message.state,
                                                   message.state_kind)
            except AsynctierError as exc:
                self.source.unavailable(exc)
                error = f"the queue could not store it: {exc}"
            else:
                if held:
                    run.expires_ms = time.time() * 1000 + self.binding.source.lease_s * 1000
                else:
                    error = "this item's lease ran out (it runs again elsewhere)"
                    self._lost([run], "not_held")
        metrics.count_checkpoint(self.binding.name, "refused" if error else "saved")
        call.send(Message("saved", seq=message.seq, error=error))

    # -- leases ---------------------------------------------------------------------------

    def _extend(self, alive: list[Run]) -> None:
        """Extend the leases of the items reported alive that are past a third of it."""
        now_ms = time.time() * 1000
        lease_ms = self.binding.source.lease_s * 1000
        due = {run.item.id: run for run in alive
               if run.expires_ms - now_ms < lease_ms * EXTEND_WHEN_LEFT}
        if not due:
            return
        try:
            held = self.source.extend(list(due))
        except AsynctierError as exc:
            self.source.unavailable(exc)
            return
        for item_id, run in due.items():
            if item_id in held:
                run.expires_ms = now_ms + lease_ms
        self._lost([run for item_id, run in due.items() if item_id not in held], "not_held")

    def _expire(self) -> None:
        """Drop the items whose lease ran out here: no heartbeat extended it."""
        now_ms = time.time() * 1000
        gone = [run for run in self.running.values() if run.expires_ms <= now_ms]
        self._lost(gone, "no_heartbeat")

    def _lost(self, runs: list[Run], why: str) -> None:
        mine = [run for run in runs if self.running.get(run.item.id) is run]
        if not mine:
            return
        for run in mine:
            del self.running[run.item.id]
        metrics.count_leases_lost(self.binding.name, why, len(mine))
        log.warning("binding %s: %d item(s) of queue topic %s lost their lease while running "
                    "(%s); they are leased again and resume from their last checkpoint; "
                    "their outcome here is ignored", self.binding.name, len(mine),
                    self.source.topic, why.replace("_", " "))

    # -- resolving ------------------------------------------------------------------------

    def _give_back(self, items: Sequence[Leased], why: str) -> None:
        self._resolve([(item, retry(0, why, NO_SCHEDULER_RETRY_S, spends_attempt=False))
                       for item in items])

    def _resolve(self, pairs: list[Pair]) -> None:
        try:
            self.source.resolve_items(pairs)
        except HandoffError as exc:
            metrics.count_handoff_failure(self.source.topic)
            log.error("binding %s: %d outcome(s) could not be written (%s); trying again in "
                      "%gs (an item whose lease runs out meanwhile runs again)",
                      self.binding.name, len(pairs), exc, self.options.handoff_retry_s)
            self.unresolved += pairs
            self._retry_at = time.monotonic() + self.options.handoff_retry_s

    def _write_unresolved(self, force: bool = False) -> None:
        if not self.unresolved or (not force and time.monotonic() < self._retry_at):
            return
        pairs, self.unresolved = self.unresolved, []
        self._resolve(pairs)

    def _gauges(self) -> None:
        metrics.set_in_flight(COMPONENT, self.binding.name, len(self.running))
        first = next(iter(self.running.values()), None)  # the oldest: they keep start order
        oldest = 0.0 if first is None else time.monotonic() - first.started
        metrics.set_longest_run(self.binding.name, self.binding.tenant, oldest)

"""The parked-key runner of a ``--ordering key`` binding (docs/design.md, Per-key order).

A thread beside the binding's main tailer, running :class:`ParkedSource` on the pipeline,
one batch at a time. Each batch is up to ``batch_size`` ready keys (their head resolved,
records waiting behind it) and the first waiting record of each, sent as one call: one
record per key, so a key's records still run one at a time, in order. A record that
succeeds (or is a dead letter) leaves its list; one to retry goes to the delay path as any
retry does and becomes its key's new head. A record leaves Redis (the batch's checkpoint)
only after its hand-off was confirmed: a crash runs it again, never skips it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from asynctier.delay_streams.handoff import Handoff, Parcel
from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.errors import HandoffError, SchedulerUnavailable
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.supervise import RestartPolicy, Supervisor
from asynctier.tailers.options import PipelineOptions
from asynctier.tailers.ordered import ran_after_header
from asynctier.tailers.parking import ParkingLot, Waiting
from asynctier.tailers.pipeline import Pipeline
from asynctier.tailers.source import TP, Batch, Prepared

log = logging.getLogger(__name__)

COMPONENT = "parked"
#: How often an idle runner asks Redis for ready keys.
IDLE_POLL_S = 0.05
#: How often it publishes the parked gauges.
STATS_EVERY_S = 1.0
#: How long it waits before trying again after Redis failed (its records stay there).
REDIS_RETRY_S = 1.0

#: A record taken: its order key, its encoded form in Redis, and the record.
Taken = tuple[str, str, Waiting]


@dataclass
class Results:
    """What became of a batch's records: (order key, encoded record, parked again,
    origin) each, for :meth:`ParkingLot.done`; filled by the hand-off."""

    rows: list[tuple[str, str, bool, str]] = field(default_factory=list)


class ParkedSource:
    """One binding's ready keys as a :class:`~asynctier.tailers.source.Source`: read =
    take each ready key's first waiting record; checkpoint = that record leaves Redis."""

    def __init__(self, binding: Binding, lot: ParkingLot, handoff: Handoff,
                 stop: threading.Event) -> None:
        self.binding = binding
        self.lot = lot
        self.handoff = handoff
        self.stop = stop
        self.what = f"binding {binding.name}: parked keys"
        self.topic = binding.source.topic
        self.ran = 0
        self._stats_at = 0.0

    def read(self, max_records: int, wait_s: float) -> list[Taken]:
        """Up to ``max_records`` ready keys' first records; waits ``wait_s`` when none."""
        self._publish()
        taken = self.lot.take(max_records)
        if not taken and wait_s > 0:
            self.stop.wait(wait_s)
        return [(okey, blob, Waiting.decode(blob)) for okey, blob in taken]

    def prepare(self, records: list[Taken]) -> Prepared[Results]:
        """One call of what fits; the rest stay in Redis, taken again later."""
        name, call = self.binding.name, CallBuilder()
        sent: list[Taken] = []
        for okey, blob, record in records:
            if not call.add(name, record.value, record.key, record.headers, 1, record.origin,
                            record.record_time_ms):
                break
            sent.append((okey, blob, record))
        return Prepared(sent, call.encode() if sent else None, Results())

    def wait(self, batch: Batch[Results], superseded: Callable[[], bool]) -> bool:
        """Nothing to keep alive while the call runs."""
        return True

    def hand_off(self, batch: Batch[Results]) -> Counter[str]:
        """A record that failed goes to the delay path or is a dead letter, named the
        records of its key waiting behind it; one to retry parks its key again."""
        counts: Counter[str] = Counter()
        rows = []
        for outcome in batch.outcomes:
            okey, blob, record = batch.records[outcome["id"]]
            parked = False
            if outcome["status"] == "ok":
                counts["ok"] += 1
            else:
                parcel = Parcel(record.value, record.key, list(record.headers),
                                record.origin, 1, record.record_time_ms)
                parcel.headers.append(ran_after_header(self.lot, record.key, record.origin,
                                                      skip=record.origin))
                what = self.handoff.resolve(self.binding, parcel, outcome)
                counts[what] += 1
                parked = what == "retry"
            rows.append((okey, blob, parked, record.origin))
        batch.extra.rows = rows
        return counts

    def confirm(self) -> None:
        """Every retry and dead letter so far delivered, or HandoffError."""
        self.handoff.confirm()

    def checkpoint(self, batch: Batch[Results], sync: bool) -> None:
        """The batch's records leave their lists (their keys move on, or park again)."""
        self.lot.done(batch.extra.rows)
        self.ran += len(batch.extra.rows)

    def checkpoint_final(self, scope: set[TP] | None) -> None:
        """Nothing: every checkpoint landed when it was made."""

    def counted(self, batch: Batch[Results]) -> None:
        """No metrics of its own (the parked gauges are published while reading)."""

    def _publish(self) -> None:
        now = time.monotonic()
        if now - self._stats_at < STATS_EVERY_S:
            return
        self._stats_at = now
        try:
            stats = self.lot.stats()
        except Exception as exc:
            log.warning("binding %s: could not read the parked keys (%s)",
                        self.binding.name, exc)
            return
        metrics.set_parked(self.binding.name, stats.keys, stats.oldest_age_s)


class ParkedRunner:
    """Runs the waiting records of one binding's unparked keys, in order per key: the
    pipeline on :class:`ParkedSource`, one batch under way (a key taken twice would run
    twice)."""

    def __init__(self, binding: Binding, client: SchedulerClient, lot: ParkingLot,
                 handoff: Handoff, batch_size: int = PipelineOptions.batch_size) -> None:
        self.binding = binding
        self.client = client
        self.lot = lot
        self.handoff = handoff
        self.options = PipelineOptions(batch_size=batch_size, max_in_flight=1,
                                       idle_poll_s=IDLE_POLL_S, linger_s=0.0,
                                       handoff_retry_s=REDIS_RETRY_S)
        self.ran = 0

    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: take ready keys, run their first records, resolve them. Redis
        failing starts a fresh pipeline after :data:`REDIS_RETRY_S`: what was taken and
        not done is still first in its list, taken again."""
        while not stop.is_set():
            source = ParkedSource(self.binding, self.lot, self.handoff, stop)
            pipeline = Pipeline(source, self.client, COMPONENT, self.binding.name,
                                self.options)
            try:
                pipeline.run(stop)
            except HandoffError as exc:
                log.error("binding %s: parked keys: %s; trying again in %gs",
                          self.binding.name, exc, REDIS_RETRY_S)
                stop.wait(REDIS_RETRY_S)
            except SchedulerUnavailable:
                return  # stopping: what was taken stays in Redis, run by the next runner
            finally:
                self.ran += source.ran
                metrics.set_in_flight(COMPONENT, self.binding.name, 0)


def start_runner(runner: ParkedRunner, stop: threading.Event,
                 policy: RestartPolicy | None = None) -> Supervisor:
    """Run ``runner`` in a thread of its own until ``stop``, restarted when it fails (its
    state is the loop ``<binding>:parked``)."""
    name = runner.binding.name
    return Supervisor(f"{name}:parked", runner.run, stop,
                      what=f"binding {name}: the parked-key runner", policy=policy,
                      hint="The parked keys wait in Redis, nothing is lost; check Redis and "
                           "the error above.",
                      on_restart=metrics.count_tailer_restart).start()

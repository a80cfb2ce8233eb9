"""The parked-key runner of a ``--ordering key`` binding (docs/design.md, Per-key order).

A thread beside the binding's main tailer. Each turn it takes up to ``batch_size`` ready
keys (their head resolved, records waiting behind it) and sends the first waiting record
of each as one call: one record per key, so a key's records still run one at a time, in
order. A record that succeeds (or is a dead letter) leaves its list; one to retry goes to
the delay path as any retry does and becomes its key's new head. A record leaves Redis
only after its hand-off was confirmed: a crash runs it again, never skips it.
"""

from __future__ import annotations

import logging
import threading
import time

from asynctier.delay_streams.handoff import Handoff, Parcel
from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.errors import HandoffError, SchedulerUnavailable
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.supervise import RestartPolicy, Supervisor
from asynctier.tailers.ordered import ran_after_header
from asynctier.tailers.parking import ParkingLot, Waiting

log = logging.getLogger(__name__)

#: How often an idle runner asks Redis for ready keys, and publishes the parked gauges.
IDLE_POLL_S = 0.05
STATS_EVERY_S = 1.0


class ParkedRunner:
    """Runs the waiting records of one binding's unparked keys, in order per key."""

    def __init__(self, binding: Binding, client: SchedulerClient, lot: ParkingLot,
                 handoff: Handoff, batch_size: int = 1000) -> None:
        self.binding = binding
        self.client = client
        self.lot = lot
        self.handoff = handoff
        self.batch_size = batch_size
        self.ran = 0
        self._stats_at = 0.0

    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: take ready keys, run their first records, resolve them."""
        while not stop.is_set():
            try:
                self._publish()
                if not self.turn(stop):
                    stop.wait(IDLE_POLL_S)
            except HandoffError as exc:
                log.error("binding %s: parked keys: %s; trying again in 1s",
                          self.binding.name, exc)
                stop.wait(1.0)
            except SchedulerUnavailable:
                return  # stopping: what was taken stays in Redis, run by the next runner

    def turn(self, stop: threading.Event) -> int:
        """One call of ready keys' first records; how many ran."""
        taken = self.lot.take(self.batch_size)
        if not taken:
            return 0
        name, call = self.binding.name, CallBuilder()
        records: list[tuple[str, str, Waiting]] = []
        for okey, blob in taken:
            record = Waiting.decode(blob)
            if not call.add(name, record.value, record.key, record.headers, 1, record.origin,
                            record.record_time_ms):
                break
            records.append((okey, blob, record))
        outcomes = self.client.submit_encoded(call.encode(), len(records)).result(stop)
        results: list[tuple[str, str, bool, str]] = []
        for outcome in outcomes:
            okey, blob, record = records[outcome["id"]]
            parked = False
            if outcome["status"] != "ok":
                parcel = Parcel(record.value, record.key, list(record.headers),
                                record.origin, 1, record.record_time_ms)
                parcel.headers.append(ran_after_header(self.lot, record.key, record.origin,
                                                      skip=record.origin))
                parked = self.handoff.resolve(self.binding, parcel, outcome) == "retry"
            results.append((okey, blob, parked, record.origin))
        self.handoff.confirm()
        self.lot.done(results)
        self.ran += len(results)
        return len(results)

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

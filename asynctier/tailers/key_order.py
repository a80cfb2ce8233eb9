"""Per-key order (``--ordering key``) as a strategy wrapped around a Kafka source
(docs/design.md, Per-key order).

:class:`KeyOrder` wraps any :class:`~asynctier.tailers.source.OffsetSource`: its records go
through a :class:`~asynctier.tailers.ordered.KeyGate` (one record per key under way, the
others in their key's lane), a key parked in Redis gets its records appended behind it
(:mod:`asynctier.tailers.parking`), and a batch's commit stops below the records still
held back. Beside it runs the parked-key runner (:mod:`asynctier.tailers.parked_runner`).
:class:`KeyHeads` is the same order's part on the delay path: a key's head that succeeds
or becomes a dead letter there unparks its key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asynctier.delay_streams.handoff import Handoff, Parcel
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.supervise import Supervisor
from asynctier.platform.wire import Outcome
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.ordered import KeyGate, LaneKey, ran_after_header
from asynctier.tailers.parked_runner import ParkedRunner, start_runner
from asynctier.tailers.parking import ParkingLot, order_key
from asynctier.tailers.partitions import sort_out
from asynctier.tailers.source import Around, Batch, OffsetSource, Prepared, high_marks

log = logging.getLogger(__name__)

#: How long a read waits, with the lanes full and nothing let go, for a batch under way
#: to let keys go (short: a batch's hand-off lets them go, and the loop checks again).
FULL_WAIT_S = 0.05


@dataclass
class Keyed:
    """What key order keeps with a batch: each sent record's origin and lane, the origins
    of keys' heads read again, and whether its keys were let go (once, however many times
    its hand-off is tried)."""

    origins: list[str]
    lanes: list[LaneKey]
    heads: set[str]
    let_go: bool = False


class KeyOrder(Around[Keyed]):
    """A Kafka source's records in order per key (see the module's doc)."""

    def __init__(self, source: OffsetSource[Any], gate: KeyGate,
                 runner: Callable[[threading.Event], Supervisor] | None = None) -> None:
        super().__init__(source)
        self.gate = gate
        self._runner = runner
        source.on_gone(gate.forget)

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """The next records of keys let go, then records read whose key is idle; the
        others wait in their key's lane (read no more while those are full)."""
        gate = self.gate
        out = gate.take(max_records)
        self.source.hold(*gate.pace())
        if gate.full():
            if not out and wait_s > 0:
                time.sleep(min(wait_s, FULL_WAIT_S))
            return out
        got = self.source.read(max(1, max_records - len(out)), 0 if out else wait_s)
        return out + gate.admit(got) if got else out

    def prepare(self, records: list[Any]) -> Prepared[Keyed]:
        """``records`` have one record per key at most (the gate gave them out); a parked
        key's record goes behind it in Redis (resolved here: the batch's records past
        ``items``). With Redis down nothing is prepared: no record may run ahead of its
        key, and the pipeline asks again after its hand-off retry wait."""
        gate = self.gate
        good, gone = sort_out(records, self.owned, self.what, self.topic)
        for msg in gone:
            gate.drop(msg)
        try:
            run, parked, heads = gate.check(good)
        except HandoffError as exc:
            log.error("%s: %s; holding %d record(s) back", self.what, exc, len(good))
            return Prepared([], None, Keyed([], [], set()), rest=good)
        call = self.source.prepare([msg for msg, _, _ in run])
        sent = call.records
        lanes = [lane for _, lane, _ in run[:len(sent)]]
        gate.sent(lanes)
        batch = sent + [msg for msg, _, _ in parked]
        origins = [origin for _, _, origin in run[:len(sent)]]
        return Prepared(batch, call.request, Keyed(origins, lanes, heads), high_marks(batch),
                        call.rest, len(sent))

    def hand_off(self, batch: Batch[Keyed]) -> Counter[str]:
        """Resolve the run records' outcomes (a retry parks its key), count the parked
        ones, and let the run records' keys go (once)."""
        keyed = batch.extra
        counts = self.gate.hand_off(self.handoff, batch.records, batch.items,
                                    batch.outcomes, keyed.lanes, keyed.origins, keyed.heads,
                                    keyed.let_go)
        keyed.let_go = True
        return counts

    def checkpoint(self, batch: Batch[Any], sync: bool) -> None:
        """Commit no further than the lowest offset read and not resolved."""
        self.source.commit(self.gate.limit(batch.records, batch.mark), sync)

    def beside(self, stop: threading.Event) -> list[Supervisor]:
        """The parked-key runner, and the source's own loops."""
        own = [self._runner(stop)] if self._runner is not None else []
        return own + self.source.beside(stop)


def by_ordering(settings: Settings, source: OffsetSource[Any], client: SchedulerClient,
                options: TailerOptions) -> OffsetSource[Any]:
    """``source`` as its binding's ``--ordering`` says: as it comes (``none``), or
    wrapped in :class:`KeyOrder` with its parked-key runner (``key``)."""
    binding: Binding = source.binding
    if binding.execution.ordering != "key":
        return source
    gate = KeyGate(binding, ParkingLot.of(settings, binding.name), options.batch_size)

    def runner(stop: threading.Event) -> Supervisor:
        return start_runner(ParkedRunner(binding, client, gate.lot, Handoff(settings),
                                         options.batch_size), stop, settings.restarts)
    return KeyOrder(source, gate, runner)


#: Per binding, the (order key, origin) of heads resolved: their keys are unparked.
Unpark = dict[str, list[tuple[str, str]]]


class KeyHeads:
    """Per-key order on the delay path: a ``--ordering key`` record that fails again names
    the records waiting behind it (``asynctier.ran-after``), and one that succeeds or
    becomes a dead letter unparks its key, once the batch's outcomes are resolved."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lots: dict[str, ParkingLot] = {}

    def lot(self, binding: str) -> ParkingLot:
        """The parked keys of a ``--ordering key`` binding (made when first needed)."""
        lot = self._lots.get(binding)
        if lot is None:
            lot = self._lots[binding] = ParkingLot.of(self.settings, binding)
        return lot

    def resolve(self, handoff: Handoff, binding: Binding, parcel: Parcel, outcome: Outcome,
                unpark: Unpark) -> str:
        """Resolve one outcome of a released record; an ordered binding's head that no
        longer waits is added to ``unpark``."""
        if binding.execution.ordering != "key":
            return handoff.resolve(binding, parcel, outcome)
        if outcome["status"] != "ok" and not any(
                name == n.H_RAN_AFTER for name, _ in parcel.headers):
            parcel.headers = [*parcel.headers,
                              ran_after_header(self.lot(binding.name), parcel.key,
                                               parcel.origin)]
        what = handoff.resolve(binding, parcel, outcome)
        if what != "retry":
            unpark.setdefault(binding.name, []).append(
                (order_key(parcel.key, parcel.origin), parcel.origin))
        return what

    def release(self, unpark: Unpark) -> None:
        """Unpark the keys of ``unpark``."""
        for name, heads in unpark.items():
            self.lot(name).unpark(heads)

"""Per-key order in the main tailer of a ``--ordering key`` binding (docs/design.md,
Per-key order).

:class:`KeyGate` decides, per batch, which records run: one record per key at a time
(a key with a record in a batch not yet handed off holds its next records back, in the
tailer), and a key parked in Redis (:mod:`asynctier.tailers.parking`) gets its records
appended behind it instead. It also keeps the partition's commit from passing a record
held back: a batch's checkpoint stops at the lowest offset read and not yet resolved.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from asynctier.delay_streams.handoff import Handoff, parcel_from_message
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.wire import Outcome
from asynctier.tailers.parking import HEAD, HELD, ParkingLot, Waiting, order_key

log = logging.getLogger(__name__)

TP = tuple[str, int]


class KeyGate:
    """Which records of a batch run now, which wait; what a checkpoint may cover."""

    def __init__(self, binding: Binding, lot: ParkingLot) -> None:
        self.binding = binding
        self.lot = lot
        self.busy: Counter[str] = Counter()  # keys with a record in a batch not handed off
        self.open: dict[TP, OrderedDict[int, None]] = {}  # offsets read, not checkpointed
        self.high: dict[TP, int] = {}  # per partition, the highest offset checkpointed

    def split(self, msgs: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any], set[int]]:
        """``msgs`` (of owned partitions, in read order) as (run, parked, held back,
        positions in run of heads read again). Parked records are in Redis already."""
        candidates: list[Any] = []
        keys: list[tuple[str, str]] = []
        held: list[Any] = []
        taken: set[str] = set()
        busy = self.busy
        for msg in msgs:
            tp, offset = (msg.topic(), msg.partition()), msg.offset()
            self.open.setdefault(tp, OrderedDict())[offset] = None
            origin = f"{tp[0]}/{tp[1]}/{offset}"
            okey = order_key(msg.key(), origin)
            if okey in taken or busy[okey]:
                held.append(msg)
                taken.add(okey)  # a later record of this key stays behind this one
                continue
            taken.add(okey)
            candidates.append(msg)
            keys.append((okey, origin))
        codes = self.lot.check(keys)
        run: list[Any] = []
        parked: list[tuple[str, Waiting]] = []
        parked_msgs: list[Any] = []
        heads: set[int] = set()
        for msg, (okey, origin), code in zip(candidates, keys, codes, strict=True):
            if code == HELD:
                parked.append((okey, Waiting(origin, msg.key(), msg.value(),
                                             list(msg.headers() or ()), msg.timestamp()[1])))
                parked_msgs.append(msg)
                continue
            if code == HEAD:
                heads.add(len(run))
            run.append(msg)
            busy[okey] += 1
        self.lot.push(parked)
        return run, parked_msgs, held, heads

    def hand_off(self, handoff: Handoff, records: Sequence[Any], items: int,
                 outcomes: Sequence[Outcome], heads: set[int], released: bool) -> Counter[str]:
        """Resolve the run records' outcomes one by one (a retry parks its key; a head read
        again that succeeded or is a dead letter unparks it), count the parked ones, and
        (once) let the run records' keys go."""
        counts: Counter[str] = Counter()
        park: list[tuple[str, str]] = []
        unpark: list[tuple[str, str]] = []
        for outcome in outcomes:
            at = outcome["id"]
            msg = records[at]
            origin = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
            okey = order_key(msg.key(), origin)
            if outcome["status"] == "ok":
                counts["ok"] += 1
                if at in heads:
                    unpark.append((okey, origin))
                continue
            parcel = parcel_from_message(msg)
            what = handoff.resolve(self.binding, parcel, outcome)
            counts[what] += 1
            (park if what == "retry" else unpark if at in heads else []).append(
                (okey, parcel.origin))
        counts["parked"] = len(records) - items
        self.lot.park(park)
        self.lot.unpark(unpark)
        if not released:
            self.let_go(records[:items])
        return counts

    def let_go(self, msgs: Sequence[Any]) -> None:
        """These records' keys may run their next record."""
        for msg in msgs:
            okey = order_key(msg.key(), f"{msg.topic()}/{msg.partition()}/x")
            self.busy[okey] -= 1
            if self.busy[okey] <= 0:
                del self.busy[okey]

    def limit(self, records: Sequence[Any], mark: dict[TP, int]) -> dict[TP, int]:
        """The batch's records are resolved: forget them, and cut ``mark`` (per partition
        the highest offset) below the lowest offset still open (read, not resolved)."""
        for msg in records:
            opened = self.open.get((msg.topic(), msg.partition()))
            if opened is not None:
                opened.pop(msg.offset(), None)
        out: dict[TP, int] = {}
        for tp, high in mark.items():
            # an earlier batch's commit may have stopped below a record held back: this
            # one covers what that one could not, up to the highest offset resolved
            high = self.high[tp] = max(self.high.get(tp, -1), high)
            opened = self.open.get(tp)
            low = next(iter(opened)) if opened else None
            out[tp] = high if low is None else min(high, low - 1)
        return out

    def forget(self, gone: set[TP] | None) -> None:
        """Partitions revoked or lost (None: all): nothing of them is open any more."""
        for tp in list(self.open) if gone is None else gone:
            self.open.pop(tp, None)
            self.high.pop(tp, None)


def ran_after_header(lot: ParkingLot, parcel_key: bytes | None, origin: str,
                     skip: str = "") -> tuple[str, bytes]:
    """The dead letter's header naming the records of its key that run after it
    (``skip``: the record itself, when it is first in its key's list)."""
    count, first = lot.waiting_origins(order_key(parcel_key, origin))
    if first and first[0] == skip:
        count, first = count - 1, first[1:]
    text = (f"{count} record(s) of this key were waiting behind it and run after it"
            + (f": {', '.join(first)}" + (" ..." if count > len(first) else "")
               if count else "") + "; so does every later record of its key")
    return n.H_RAN_AFTER, text.encode()

"""Per-key order in the main tailer of a ``--ordering key`` binding (docs/design.md,
Per-key order).

:class:`KeyGate` keeps one *lane* per key with a record under way (given to the pipeline,
not yet handed off): the key's later records, read meanwhile, wait in it, in offset order,
so that a key has at most one record in flight while the other keys fill the batches.
When a key's record is handed off, its lane's first record may go (:meth:`KeyGate.take`).
Each record is looked at once when read, once when it leaves its lane, and once when its
batch is built (:meth:`KeyGate.check`: one Redis call per batch, which keys are parked;
a key parked in Redis (:mod:`asynctier.tailers.parking`) gets its records appended behind
it instead). The gate also keeps the partition's commit from passing a record held back:
a batch's checkpoint stops at the lowest offset read and not yet resolved.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from asynctier.delay_streams.handoff import Handoff, parcel_from_message, where
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.wire import Outcome
from asynctier.tailers.options import PipelineOptions
from asynctier.tailers.parking import FREE, HEAD, HELD, ParkingLot, Waiting, order_key

log = logging.getLogger(__name__)

TP = tuple[str, int]

#: Records held in lanes (read, waiting behind their key) before the tailer pauses a
#: partition (in batch sizes: the other partitions' keys keep coming), and in all before
#: it stops reading (in batch sizes and in bytes of values): a tailer's memory does not
#: grow with a backlog, and one deep partition does not keep the others' keys idle.
HELD_PER_PARTITION = 2
HELD_BATCHES = 50
HELD_BYTES = 32 << 20
#: Up to this many parked keys, one call reads them all (and their heads) and the batch is
#: checked against them here; with more, Redis checks each key of the batch.
PARKED_VIEW = 1000


#: What the gate orders a record by, in memory: its key, or (keyless) its partition.
LaneKey = bytes | int


def lane_key(msg: Any) -> LaneKey:
    """The key of a Kafka message's lane: its key, or, keyless, its partition."""
    key: bytes | None = msg.key()
    return key if key is not None else int(msg.partition())


def redis_key(lane: LaneKey) -> str:
    """The lane's name in Redis: :func:`~asynctier.tailers.parking.order_key`'s."""
    return "k" + lane.hex() if isinstance(lane, bytes) else f"p{lane}"


class KeyGate:
    """Which records run now, which wait behind their key; what a checkpoint may cover."""

    def __init__(self, binding: Binding, lot: ParkingLot,
                 batch_size: int = PipelineOptions.batch_size) -> None:
        self.binding = binding
        self.lot = lot
        # a key with a record under way -> its records read since (a key let go with
        # records in its lane stays here, and is in ``ready`` until one is taken)
        self.lanes: dict[LaneKey, deque[Any]] = {}
        self.ready: deque[LaneKey] = deque()
        self.unsent: dict[LaneKey, Any] = {}  # key -> its record given out, not in a call yet
        self.held = 0  # records in lanes, and their values' bytes
        self.held_bytes = 0
        self.held_tp: Counter[TP] = Counter()  # records in lanes per partition
        self.paused: set[TP] = set()  # partitions not read while their lanes are deep
        self.max_held = HELD_BATCHES * max(1, batch_size)
        self.max_held_tp = HELD_PER_PARTITION * max(1, batch_size)
        self.open: dict[TP, OrderedDict[int, None]] = {}  # offsets read, not checkpointed
        self.high: dict[TP, int] = {}  # per partition, the highest offset checkpointed

    # -- reading: lanes -------------------------------------------------------------------

    def full(self) -> bool:
        """True when the lanes hold enough: read no more until some records leave."""
        return self.held >= self.max_held or self.held_bytes >= HELD_BYTES

    def pace(self) -> tuple[list[TP], list[TP]]:
        """(partitions to pause, to resume): a partition whose lanes hold
        ``max_held_tp`` records is paused until they are down to half of it."""
        cap, held_tp, paused = self.max_held_tp, self.held_tp, self.paused
        stop = [tp for tp, count in held_tp.items() if count >= cap and tp not in paused]
        go = [tp for tp in paused if held_tp[tp] <= cap // 2]
        paused.update(stop)
        paused.difference_update(go)
        return stop, go

    def admit(self, msgs: Sequence[Any]) -> list[Any]:
        """Records just read (in read order): those whose key is idle, which may run now;
        the others go into their key's lane. Consume errors pass through."""
        out: list[Any] = []
        lanes, opened, unsent = self.lanes, self.open, self.unsent
        for msg in msgs:
            if msg.error() is not None:
                out.append(msg)
                continue
            tp = (msg.topic(), msg.partition())
            offsets = opened.get(tp)
            if offsets is None:
                offsets = opened[tp] = OrderedDict()
            offsets[msg.offset()] = None
            okey = lane_key(msg)
            lane = lanes.get(okey)
            if lane is None:
                lanes[okey] = deque()
                unsent[okey] = msg
                out.append(msg)
            else:
                lane.append(msg)
                self.held += 1
                self.held_tp[tp] += 1
                value = msg.value()
                self.held_bytes += len(value) if value else 0
        return out

    def take(self, limit: int) -> list[Any]:
        """Up to ``limit`` records of keys let go since: each the first of its lane."""
        out: list[Any] = []
        ready, lanes, unsent = self.ready, self.lanes, self.unsent
        while ready and len(out) < limit:
            okey = ready.popleft()
            lane = lanes.get(okey)
            if not lane:  # its records were of a partition gone meanwhile
                lanes.pop(okey, None)
                continue
            msg = lane.popleft()
            self.held -= 1
            self.held_tp[(msg.topic(), msg.partition())] -= 1
            value = msg.value()
            self.held_bytes -= len(value) if value else 0
            unsent[okey] = msg
            out.append(msg)
        return out

    def has_ready(self) -> bool:
        """True when some key's next record may go now."""
        return bool(self.ready)

    def _release(self, okey: LaneKey) -> None:
        lane = self.lanes.get(okey)
        if lane is None:
            return
        if lane:
            self.ready.append(okey)
        else:
            del self.lanes[okey]

    def drop(self, msg: Any) -> None:
        """A record given out that will not run here (its partition is gone)."""
        okey = lane_key(msg)
        if self.unsent.get(okey) is msg:
            del self.unsent[okey]
            self._release(okey)

    def let_go(self, okeys: Sequence[LaneKey]) -> None:
        """These keys' records under way are handed off: their next records may run."""
        release = self._release
        for okey in okeys:
            release(okey)

    # -- building a batch -----------------------------------------------------------------

    def check(self, msgs: Sequence[Any]) -> tuple[list[tuple[Any, LaneKey, str]],
                                                  list[tuple[Any, LaneKey, str]], set[str]]:
        """``msgs`` (given out, of owned partitions) as (run, parked, heads): (record,
        lane, origin) each; parked ones are appended behind their key in Redis (and
        let go here); ``heads``: origins of keys' heads read again (they run).

        A record the gate forgot since it gave it out (its partition was revoked or lost
        meanwhile, see :meth:`forget`) is left out: its key may have another record out
        by now (the partition assigned again, read again from its commit), and that one,
        not this, is the key's record under way."""
        rows = [(msg, lane_key(msg), where(msg)) for msg in msgs]
        rows = [row for row in rows if self.gave_out(row[0], row[1])]
        view = self.lot.parked_view(PARKED_VIEW)
        if view is None:  # many keys parked: Redis checks each one
            codes = self.lot.check([(redis_key(lane), origin) for _, lane, origin in rows])
        elif not view:  # nothing parked (the common case): no per-record work
            return rows, [], set()
        else:
            codes = [FREE if (head := view.get(redis_key(lane))) is None
                     else HEAD if head == origin else HELD for _, lane, origin in rows]
        run: list[tuple[Any, LaneKey, str]] = []
        parked: list[tuple[Any, LaneKey, str]] = []
        heads: set[str] = set()
        for row, code in zip(rows, codes, strict=True):
            if code == HELD:
                parked.append(row)
                continue
            if code == HEAD:
                heads.add(row[2])
            run.append(row)
        if parked:
            self.lot.push([(redis_key(lane), Waiting(origin, msg.key(), msg.value(),
                                                     list(msg.headers() or ()),
                                                     msg.timestamp()[1]))
                           for msg, lane, origin in parked])
            for row in parked:
                del self.unsent[row[1]]
                self._release(row[1])
        return run, parked, heads

    def gave_out(self, msg: Any, okey: LaneKey) -> bool:
        """True when ``msg`` is its key's record given out and not forgotten since."""
        return self.unsent.get(okey) is msg

    def sent(self, okeys: Sequence[LaneKey]) -> None:
        """These keys' records are in a call now (under way until handed off)."""
        unsent = self.unsent
        for okey in okeys:
            unsent.pop(okey, None)

    # -- resolving ------------------------------------------------------------------------

    def hand_off(self, handoff: Handoff, records: Sequence[Any], items: int,
                 outcomes: Sequence[Outcome], okeys: Sequence[LaneKey], origins: Sequence[str],
                 heads: set[str], released: bool) -> Counter[str]:
        """Resolve the run records' outcomes (a retry parks its key; a head read again
        that succeeded or is a dead letter unparks it), count the parked ones, and (once)
        let the run records' keys go."""
        counts: Counter[str] = Counter()
        park: list[tuple[str, str]] = []
        unpark: list[tuple[str, str]] = []
        ok = 0
        for outcome in outcomes:
            if outcome["status"] == "ok":
                ok += 1
                if heads and origins[outcome["id"]] in heads:
                    at = outcome["id"]
                    unpark.append((redis_key(okeys[at]), origins[at]))
                continue
            at = outcome["id"]
            parcel = parcel_from_message(records[at])
            what = handoff.resolve(self.binding, parcel, outcome)
            counts[what] += 1
            if what == "retry":
                park.append((redis_key(okeys[at]), parcel.origin))
            elif origins[at] in heads:
                unpark.append((redis_key(okeys[at]), parcel.origin))
        if ok:
            counts["ok"] = ok
        counts["parked"] = len(records) - items
        self.lot.park(park)
        self.lot.unpark(unpark)
        if not released:
            self.let_go(okeys)
        return counts

    def limit(self, records: Sequence[Any], mark: dict[TP, int]) -> dict[TP, int]:
        """The batch's records are resolved: forget them, and cut ``mark`` (per partition
        the highest offset) below the lowest offset still open (read, not resolved)."""
        opened = self.open
        for msg in records:
            offsets = opened.get((msg.topic(), msg.partition()))
            if offsets is not None:
                offsets.pop(msg.offset(), None)
        out: dict[TP, int] = {}
        for tp, high in mark.items():
            # an earlier batch's commit may have stopped below a record held back: this
            # one covers what that one could not, up to the highest offset resolved
            high = self.high[tp] = max(self.high.get(tp, -1), high)
            offsets = opened.get(tp)
            low = next(iter(offsets)) if offsets else None
            out[tp] = high if low is None else min(high, low - 1)
        return out

    def forget(self, gone: set[TP] | None) -> None:
        """Partitions revoked or lost (None: all): nothing of them is open any more, their
        records in lanes are dropped, and their keys' records given out and not sent
        (dropped by the pipeline too) no longer hold their keys."""
        def is_gone(msg: Any) -> bool:
            return gone is None or (msg.topic(), msg.partition()) in gone

        for tp in list(self.open) if gone is None else gone:
            self.open.pop(tp, None)
            self.high.pop(tp, None)
        for tp in list(self.held_tp) if gone is None else gone:
            self.held_tp.pop(tp, None)
        self.paused = set() if gone is None else self.paused - gone
        for lane in self.lanes.values():
            if any(is_gone(m) for m in lane):
                kept = [m for m in lane if not is_gone(m)]
                for m in lane:
                    if is_gone(m):
                        self.held -= 1  # (held_tp: dropped above)
                        value = m.value()
                        self.held_bytes -= len(value) if value else 0
                lane.clear()
                lane.extend(kept)
        for okey, msg in list(self.unsent.items()):
            if is_gone(msg):
                del self.unsent[okey]
                self._release(okey)


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

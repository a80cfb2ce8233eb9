"""The main tailer's per-key gate (``tailers/ordered.py``, :class:`KeyGate`) on a real Redis:
a hypothesis state machine reads, takes, checks, sends and hands off records with random
outcomes, runs the parked-key runner's and the delay path's part, and revokes, loses and
assigns partitions; no key ever has two records running, and no record of a key starts
before every earlier record of its key has succeeded (issue 32). Plus the plain cases.

The records are plain objects with the accessors of confluent-kafka's ``Message`` (the
gate's unit of data); Redis is the session's real one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from asynctier.delay_streams.handoff import Parcel
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.redis_client import sync_client
from asynctier.platform.wire import Outcome
from asynctier.tailers.ordered import KeyGate, LaneKey, lane_key, redis_key
from asynctier.tailers.parking import ParkingLot, Waiting

TOPIC = "orders"
PARTITIONS = (0, 1)
KEYS = (b"a", b"b", b"c", None)


@dataclass(frozen=True, eq=False)
class Rec:
    """A consumed record, with the accessors of confluent-kafka's ``Message``."""

    p: int
    o: int
    k: bytes | None

    def topic(self) -> str:
        """The topic."""
        return TOPIC

    def partition(self) -> int:
        """The partition."""
        return self.p

    def offset(self) -> int:
        """The offset."""
        return self.o

    def key(self) -> bytes | None:
        """The key."""
        return self.k

    def value(self) -> bytes:
        """The value."""
        return b"%d/%d" % (self.p, self.o)

    def headers(self) -> list[tuple[str, bytes]]:
        """No headers."""
        return []

    def timestamp(self) -> tuple[int, int]:
        """A create time."""
        return (1, 1000 + self.o)

    def error(self) -> None:
        """Never a consume error."""
        return None


class Resolver:
    """The hand-off's part the gate calls: every non-ok outcome is a retry (the delay
    path is the state machine's list ``delayed``)."""

    def __init__(self) -> None:
        self.retried: list[Parcel] = []

    def resolve(self, binding: Binding, parcel: Parcel, outcome: Outcome) -> str:
        """A retry, remembered."""
        self.retried.append(parcel)
        return "retry"


def outcome(at: int, ok: bool) -> Outcome:
    """The scheduler's answer for item ``at``."""
    return Outcome(id=at, status="ok" if ok else "retry", after_s=1.0,
                   error=None if ok else "boom", spends_attempt=True, reason=None)


@dataclass
class Sent:
    """A batch under way: its records (run, then parked), okeys, origins, heads, mark."""

    records: list[Rec]
    items: int
    okeys: list[LaneKey]
    origins: list[str]
    heads: set[str]
    mark: dict[tuple[str, int], int] = field(default_factory=dict)
    released: bool = False


class GateModel:
    """The tailer around a KeyGate: a log per partition, a consumer position, the
    pipeline's pending records and batches, and what ran and succeeded."""

    def __init__(self, lot: ParkingLot) -> None:
        self.lot = lot
        self.binding = Binding("gate", Source("kafka", TOPIC), "tests.funcs.order:step",
                               execution=Execution(ordering="key"))
        self.gate = KeyGate(self.binding, lot, batch_size=4)
        self.resolver = Resolver()
        self.log: dict[int, list[Rec]] = {p: [] for p in PARTITIONS}
        self.pos = dict.fromkeys(PARTITIONS, 0)
        self.committed = dict.fromkeys(PARTITIONS, 0)
        self.owned: set[int] = set(PARTITIONS)
        self.pending: list[Any] = []
        self.in_flight: list[Sent] = []
        self.delayed: list[tuple[str, str]] = []  # (order key, origin) on the delay path
        self.running: dict[str, list[str]] = {}  # order key -> origins of it running
        self.succeeded: set[str] = set()

    # -- what a run must respect ----------------------------------------------------------

    def record_of(self, origin: str) -> Rec:
        """The record of ``topic/partition/offset``."""
        _, p, o = origin.rsplit("/", 2)
        return self.log[int(p)][int(o)]

    def start(self, origin: str) -> None:
        """A record starts running: its key has no other record running, and every
        earlier record of its key succeeded (a record run again after its success, as
        at-least-once allows, is not looked at)."""
        if origin in self.succeeded:
            return
        rec = self.record_of(origin)
        runs = self.running.setdefault(redis_key(lane_key(rec)), [])
        others = [o for o in runs if o != origin]
        assert not others, f"{origin} starts while {others} of its key runs"
        earlier = [f"{TOPIC}/{rec.p}/{r.o}" for r in self.log[rec.p][:rec.o]
                   if lane_key(r) == lane_key(rec)]
        missing = [o for o in earlier if o not in self.succeeded]
        assert not missing, f"{origin} starts before {missing} of its key succeeded"
        runs.append(origin)

    def finish(self, origin: str, ok: bool) -> None:
        """A run ends."""
        runs = self.running.get(redis_key(lane_key(self.record_of(origin))), [])
        if origin in runs:
            runs.remove(origin)
        if ok:
            self.succeeded.add(origin)

    # -- the tailer's steps ---------------------------------------------------------------

    def consume(self, limit: int) -> list[Rec]:
        """The consumer: records of owned partitions from their positions."""
        got: list[Rec] = []
        for p in sorted(self.owned):
            while self.pos[p] < len(self.log[p]) and len(got) < limit:
                got.append(replace(self.log[p][self.pos[p]]))  # a new Message each read
                self.pos[p] += 1
        return got

    def read(self, limit: int, revoke_meanwhile: int | None, assign_again: bool = False) -> None:
        """KeyOrder.read: first the keys let go, then what the consumer has
        (whose poll may serve a revoke, and the partition's assignment again)."""
        out = self.gate.take(limit)
        if revoke_meanwhile is not None and revoke_meanwhile in self.owned:
            self.revoke(revoke_meanwhile)
            if assign_again:
                self.assign(revoke_meanwhile)
        got = self.consume(max(1, limit - len(out)))
        self.pending += out + self.gate.admit(got)

    def prepare(self, fit: int) -> None:
        """KeyOrder.prepare, then the call: ``fit`` records fit in it."""
        records, self.pending = self.pending, []
        good = []
        for msg in records:
            if msg.partition() in self.owned:
                good.append(msg)
            else:
                self.gate.drop(msg)
        run, parked, heads = self.gate.check(good)
        sent, rest = run[:fit], [row[0] for row in run[fit:]]
        self.pending = rest + self.pending
        okeys = [row[1] for row in sent]
        self.gate.sent(okeys)
        for _, _, origin in sent:
            self.start(origin)
        batch = [row[0] for row in sent] + [row[0] for row in parked]
        if not batch:
            return
        mark: dict[tuple[str, int], int] = {}
        for msg in batch:
            tp = (TOPIC, msg.partition())
            mark[tp] = max(mark.get(tp, -1), msg.offset())
        self.in_flight.append(Sent(batch, len(sent), okeys, [row[2] for row in sent],
                                   heads, mark))

    def resolve_oldest(self, oks: list[bool]) -> None:
        """The oldest batch's answer: hand off (the gate parks and lets go), checkpoint."""
        batch = self.in_flight.pop(0)
        outcomes = [outcome(at, oks[at % len(oks)] if oks else True)
                    for at in range(batch.items)]
        for at, origin in enumerate(batch.origins):
            self.finish(origin, outcomes[at]["status"] == "ok")
            if outcomes[at]["status"] != "ok":
                self.delayed.append((redis_key(batch.okeys[at]), origin))
        self.gate.hand_off(self.resolver, batch.records, batch.items,  # type: ignore[arg-type]
                           outcomes, batch.okeys, batch.origins, batch.heads, False)
        for (_, p), upto in self.gate.limit(batch.records, batch.mark).items():
            if p in self.owned:
                self.committed[p] = max(self.committed[p], upto + 1)

    def revoke(self, p: int) -> None:
        """on_revoke: the pipeline drops the pending records of ``p``, drains (every batch
        resolved, all ok), and the gate forgets ``p``."""
        self.pending = [m for m in self.pending if m.partition() != p]
        while self.in_flight:
            self.resolve_oldest([True])
        self.owned.discard(p)
        self.gate.forget({(TOPIC, p)})

    def lose(self, p: int) -> None:
        """on_lost: nothing of ``p`` is committed; its batches under way finish later."""
        self.owned.discard(p)
        self.gate.forget({(TOPIC, p)})
        self.pending = [m for m in self.pending if m.partition() != p]

    def assign(self, p: int) -> None:
        """on_assign: ``p`` is read again from its committed offset."""
        self.owned.add(p)
        self.pos[p] = self.committed[p]

    def delay_run(self, at: int, ok: bool) -> None:
        """A record on the delay path runs; a success unparks its key."""
        okey, origin = self.delayed[at]
        self.start(origin)
        self.finish(origin, ok)
        if ok:
            del self.delayed[at]
            self.lot.unpark([(okey, origin)])

    def runner_turn(self, oks: list[bool]) -> None:
        """The parked-key runner: ready keys' first waiting records run."""
        taken = self.lot.take(10)
        results = []
        for at, (okey, blob) in enumerate(taken):
            origin = Waiting.decode(blob).origin
            ok = oks[at % len(oks)] if oks else True
            self.start(origin)
            self.finish(origin, ok)
            if not ok:
                self.delayed.append((okey, origin))
            results.append((okey, blob, not ok, origin))
        self.lot.done(results)


def test_gate_keeps_each_keys_records_one_at_a_time_in_order(redis_url: str,
                                                              redis_client: redis.Redis,
                                                              prefix: str) -> None:
    run_machine(redis_url, prefix, examples=25)


@pytest.mark.slow
def test_gate_keeps_order_over_many_runs(redis_url: str, redis_client: redis.Redis,
                                         prefix: str) -> None:
    run_machine(redis_url, prefix, examples=500)


def run_machine(redis_url: str, prefix: str, examples: int) -> None:
    """Run the gate's state machine ``examples`` times (keys under ``prefix``)."""
    client = sync_client(redis_url)
    outs = st.lists(st.booleans(), max_size=4)

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            # each example's own keys: nothing parked by an earlier one
            self.m = GateModel(ParkingLot(client, f"{prefix}:x{uuid.uuid4().hex[:8]}", "gate"))

        @rule(p=st.sampled_from(PARTITIONS), k=st.sampled_from(KEYS),
              n=st.integers(1, 4))
        def produce(self, p: int, k: bytes | None, n: int) -> None:
            log = self.m.log[p]
            base = len(log)
            log.extend(Rec(p, base + i, k) for i in range(n))

        @rule(limit=st.integers(1, 6),
              revoke=st.none() | st.sampled_from(PARTITIONS), again=st.booleans())
        def read(self, limit: int, revoke: int | None, again: bool) -> None:
            self.m.read(limit, revoke, again)

        @precondition(lambda self: bool(self.m.pending))
        @rule(fit=st.integers(0, 4))
        def prepare(self, fit: int) -> None:
            self.m.prepare(fit)

        @precondition(lambda self: bool(self.m.in_flight))
        @rule(oks=outs)
        def resolve(self, oks: list[bool]) -> None:
            self.m.resolve_oldest(oks)

        @precondition(lambda self: bool(self.m.delayed))
        @rule(data=st.data(), ok=st.booleans())
        def delay_run(self, data: st.DataObject, ok: bool) -> None:
            self.m.delay_run(data.draw(st.integers(0, len(self.m.delayed) - 1)), ok)

        @rule(oks=outs)
        def runner_turn(self, oks: list[bool]) -> None:
            self.m.runner_turn(oks)

        @rule(p=st.sampled_from(PARTITIONS))
        def revoke(self, p: int) -> None:
            if p in self.m.owned:
                self.m.revoke(p)

        @rule(p=st.sampled_from(PARTITIONS))
        def lose(self, p: int) -> None:
            if p in self.m.owned:
                self.m.lose(p)

        @rule(p=st.sampled_from(PARTITIONS))
        def assign(self, p: int) -> None:
            if p not in self.m.owned:
                self.m.assign(p)

        @invariant()
        def bookkeeping(self) -> None:
            gate = self.m.gate
            assert gate.held == sum(len(lane) for lane in gate.lanes.values())
            assert len(gate.ready) == len(set(gate.ready)), "a key is ready twice"

    Machine.TestCase.settings = settings(max_examples=examples, stateful_step_count=50,
                                         deadline=None,
                                         suppress_health_check=list(HealthCheck))
    try:
        run_state_machine_as_test(Machine, settings=Machine.TestCase.settings)
    finally:
        client.close()


@pytest.fixture
def model(redis_url: str, redis_client: redis.Redis, prefix: str) -> Iterator[GateModel]:
    """A gate and its tailer on the session's Redis (the test's keys deleted after)."""
    got = GateModel(ParkingLot(sync_client(redis_url), prefix, "gate"))
    yield got
    got.lot.redis.close()


def test_a_record_taken_before_its_partition_was_revoked_does_not_run(
        model: GateModel) -> None:
    """A record of a key let go, taken by a read whose poll then serves the revoke of its
    partition, reaches the pipeline after the gate forgot it; once the partition is
    assigned again it must not run beside the records read again (nor free its key
    twice)."""
    model.log[0].extend(Rec(0, o, b"a") for o in range(4))
    model.read(2, None)  # 0 runs, 1 waits in a's lane
    model.prepare(4)
    model.resolve_oldest([True])  # a is let go: 1 is next
    model.read(1, revoke_meanwhile=0)  # 1 taken, then p0 revoked by the same read
    model.assign(0)  # read again from the commit (1)
    model.read(4, None)
    model.prepare(4)
    assert len(model.in_flight) == 1 and model.in_flight[0].origins == ["orders/0/1"]
    model.resolve_oldest([True])
    assert len(model.gate.ready) == len(set(model.gate.ready))
    for _ in range(4):
        model.read(4, None)
        model.prepare(4)
        while model.in_flight:
            model.resolve_oldest([True])
    assert model.succeeded == {f"orders/0/{o}" for o in range(4)}

"""``--defer-when-busy`` without services: the binding's checks, when a scheduler counts as
saturated (its real bounded queue), and which records are parked for how long."""

from __future__ import annotations

import asyncio
import io
import json
import time
from importlib import resources

import fastavro
import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Deadlines, Retries, Source
from asynctier.platform.errors import BindingError
from asynctier.platform.schemas import MAGIC
from asynctier.platform.wire import Item
from asynctier.scheduler.bounded import BoundedQueue, Chunk
from asynctier.scheduler.deferral import RELEASE_SHARE, Saturation, defer, park_s
from asynctier.scheduler.queues import FairQueue

HOUR = 3600.0
COLD = Binding("cold", Source("kafka", "t"), "m:f", retries=Retries(ladder_s=(5.0, 60.0)),
               deadlines=Deadlines(start_within_s=2 * HOUR, defer_when_busy=True))
HOT = Binding("hot", Source("kafka", "t"), "m:f", priority="urgent")


def _items(binding: Binding, n: int, deadline_ms: int | None) -> list[Item]:
    return [{"id": i, "binding": binding.name, "payload": b"{}", "key": None, "headers": [],
             "attempt": 1, "source_ref": "", "record_time_ms": 0, "priority": 0,
             "deadline_ms": deadline_ms} for i in range(n)]


def test_defer_needs_a_deadline_hours_away() -> None:
    with pytest.raises(BindingError, match=r"--defer-when-busy .* --start-within 1h or more "
                                           r"\(none given\)"):
        Binding("b", Source("kafka", "t"), "m:f",
                deadlines=Deadlines(defer_when_busy=True)).validate()
    with pytest.raises(BindingError, match=r"\(5m given\)"):
        Binding("b", Source("kafka", "t"), "m:f",
                deadlines=Deadlines(start_within_s=300, defer_when_busy=True)).validate()
    assert Binding("b", Source("kafka", "t"), "m:f",
                   deadlines=Deadlines(start_within_s=HOUR, defer_when_busy=True)).validate()


def test_defer_survives_the_bindings_topic_and_older_records_read_false() -> None:
    assert Binding.decode(COLD.encode()) == COLD
    path = resources.files("asynctier").joinpath("schemas", "history", "binding-2.avsc")
    old = fastavro.parse_schema(json.loads(path.read_text()))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old, HOT.to_record())
    from asynctier.platform.schemas import _fingerprint  # the marker of binding-2

    read = Binding.decode(MAGIC + _fingerprint(old) + body.getvalue())
    assert read == HOT and read.deadlines.defer_when_busy is False


def test_parked_for_the_first_ladder_step_until_a_quarter_of_the_window_is_left() -> None:
    now_ms = 1_000_000_000
    far = _items(COLD, 1, now_ms + int(2 * HOUR * 1000))[0]
    assert park_s(COLD, far, now_ms) == 5.0
    release_ms = now_ms + int(2 * HOUR * RELEASE_SHARE * 1000)
    nearly = _items(COLD, 1, release_ms + 2000)[0]
    assert park_s(COLD, nearly, now_ms) == pytest.approx(2.0)  # never past the release
    assert park_s(COLD, _items(COLD, 1, release_ms)[0], now_ms) is None
    assert park_s(COLD, _items(COLD, 1, now_ms - 1)[0], now_ms) is None  # overdue: run


def _chunk(binding: Binding, n: int) -> Chunk:
    future: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()
    return Chunk(binding, _items(binding, n, None), future)  # type: ignore[arg-type]


class Clock:
    """A monotonic clock the test moves by hand: no sleep decides a judgement."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_saturated_only_while_work_that_does_not_defer_waits() -> None:
    async def scenario() -> None:
        clock = Clock()
        queue = BoundedQueue(FairQueue(), 1000, clock=clock)
        sat = Saturation(queue, waited_s=0.05, hold_s=0.3)
        await queue.put(_chunk(COLD, 50))  # deferrable work waiting: not saturated
        clock.now += 0.1
        assert not sat.saturated()
        await queue.put(_chunk(HOT, 10))
        assert not sat.saturated()  # it has just come: a worker may take it at once
        clock.now += 0.04
        assert not sat.saturated()  # not settled yet
        clock.now += 0.02
        assert sat.saturated()
        while queue.items:
            await queue.get()
        clock.now += 0.29
        assert sat.saturated()  # held a moment after the firm work left ...
        clock.now += 0.02
        assert not sat.saturated()  # ... then released
        for _ in range(10):  # a trickle taken at once never saturates
            await queue.put(_chunk(HOT, 1))
            clock.now += 0.01
            await queue.get()
            clock.now += 0.02
        assert not sat.saturated()
    asyncio.run(scenario())


def test_one_firm_chunk_that_waited_for_a_worker_makes_it_busy_for_hold_s() -> None:
    """Busy is a firm chunk's wait from its put to its get, even when the firm queue was
    never non-empty for long: an urgent chunk that found every worker taken."""
    async def scenario() -> None:
        clock = Clock()
        queue = BoundedQueue(FairQueue(), 1000, clock=clock)
        sat = Saturation(queue, waited_s=0.01, hold_s=1.0)
        await queue.put(_chunk(HOT, 1))
        clock.now += 0.005
        await queue.get()  # taken at once: nothing waited
        assert not sat.saturated()
        await queue.put(_chunk(HOT, 1))
        clock.now += 0.012
        await queue.get()  # waited 12 ms for a worker
        clock.now += 0.9
        assert sat.saturated()
        clock.now += 0.11
        assert not sat.saturated()  # 1 s after the wait, with none since
    asyncio.run(scenario())


def test_while_saturated_far_records_park_without_an_attempt_and_near_ones_run() -> None:
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(), 1000)
        sat = Saturation(queue, waited_s=0.0, hold_s=0.1)
        now_ms = int(time.time() * 1000)
        far = _items(COLD, 3, now_ms + int(2 * HOUR * 1000))
        near = [{**i, "id": 10 + i["id"]}  # type: ignore[typeddict-item]
                for i in _items(COLD, 2, now_ms + 60_000)]
        assert defer(COLD, far + near, sat) == ([], far + near)  # idle: all run
        await queue.put(_chunk(HOT, 5))
        assert sat.saturated()  # no settling time here
        parked, run = defer(COLD, far + near, sat)
        assert run == near
        assert [o["id"] for o in parked] == [0, 1, 2]
        assert all(o["status"] == "retry" and not o["spends_attempt"] and o["after_s"] == 5.0
                   for o in parked)
        assert "deferred" in str(parked[0]["error"])
        hot = _items(HOT, 4, None)
        assert defer(HOT, hot, sat) == ([], hot)  # a binding that does not defer
    asyncio.run(scenario())


def test_removing_chunks_keeps_the_rest_in_order_and_the_counts_right() -> None:
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(quantum=4), 1000)
        hot = [_chunk(HOT, 3) for _ in range(2)]
        cold = [_chunk(COLD, 5) for _ in range(3)]
        other = _chunk(Binding("x", Source("kafka", "t"), "m:f", tenant="acme"), 2)
        for chunk in (hot[0], cold[0], cold[1], other, hot[1], cold[2]):
            await queue.put(chunk)
        assert queue.remove_where(lambda c: c.binding.deadlines.defer_when_busy) == cold
        assert (queue.items, len(queue.fair), queue.firm_items) == (8, 3, 8)
        assert queue.fair.items_of_tenant("default") == 6
        left = [await queue.get() for _ in range(3)]
        assert [c for c in left if c in hot] == hot and other in left
        assert (queue.items, queue.firm_items, queue.firm_since) == (0, 0, None)
    asyncio.run(scenario())

"""The scheduler's queues: tiers by stride, tenants by DRR, FIFO within a tenant, room."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.scheduler.bounded import BoundedQueue, Chunk
from asynctier.scheduler.queues import FairQueue, TenantDRR, pick_waiter
from asynctier.scheduler.sizing import ChunkSizer
from tests.helpers import until
from tests.scheduler_harness import items

QUANTUM = 64
pushes = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, QUANTUM)),
                  max_size=200)


def drain_drr(drr: TenantDRR[int]) -> list[tuple[str, int, int]]:
    out = []
    while drr:
        out.append(drr.pop())
    return out


def test_drr_alternates_between_equal_tenants() -> None:
    drr: TenantDRR[int] = TenantDRR(quantum=10)
    for n in range(5):
        drr.push("flood", n, 10)
    drr.push("trickle", 100, 10)
    assert [t for t, _, _ in drain_drr(drr)][:3] == ["flood", "trickle", "flood"]


@given(pushes)
def test_drr_serves_everything_once_fifo_within_a_tenant(entries: list[tuple[str, int]]) -> None:
    drr: TenantDRR[int] = TenantDRR(QUANTUM)
    for n, (tenant, cost) in enumerate(entries):
        drr.push(tenant, n, cost)
    out = drain_drr(drr)
    assert sorted(e for _, e, _ in out) == list(range(len(entries)))
    for tenant in "abc":
        mine = [e for t, e, _ in out if t == tenant]
        assert mine == sorted(mine)
    assert drr.items == 0


@given(st.lists(st.integers(1, QUANTUM), min_size=1, max_size=100),
       st.lists(st.integers(1, QUANTUM), min_size=1, max_size=100),
       st.sampled_from([1.0, 2.0, 3.0]))
def test_drr_shares_by_weight_while_both_are_backlogged(a: list[int], b: list[int],
                                                         weight_a: float) -> None:
    drr: TenantDRR[int] = TenantDRR(QUANTUM, {"a": weight_a})
    for cost in a:
        drr.push("a", 0, cost)
    for cost in b:
        drr.push("b", 0, cost)
    served: Counter[str] = Counter()
    left = {"a": len(a), "b": len(b)}
    while left["a"] and left["b"]:
        tenant, _, cost = drr.pop()
        served[tenant] += cost
        left[tenant] -= 1
        # neither tenant gets ahead of its share by more than a turn and a chunk
        assert abs(served["a"] / weight_a - served["b"]) <= QUANTUM + 2 * QUANTUM


@given(st.lists(st.tuples(st.sampled_from(["urgent", "normal", "batch"]),
                          st.sampled_from(["a", "b"]), st.integers(1, QUANTUM)), max_size=200))
def test_fair_queue_serves_everything_once(entries: list[tuple[str, str, int]]) -> None:
    queue: FairQueue[int] = FairQueue(QUANTUM)
    for n, (tier, tenant, cost) in enumerate(entries):
        queue.push(tier, tenant, n, cost)
    assert queue.items == sum(c for _, _, c in entries)
    out = []
    while queue:
        out.append(queue.pop())
    assert sorted(out) == list(range(len(entries)))
    for tier in ("urgent", "normal", "batch"):
        for tenant in "ab":
            mine = [n for n in out if entries[n][:2] == (tier, tenant)]
            assert mine == sorted(mine)
    assert queue.items == 0 and queue.items_by_tier() == {"urgent": 0, "normal": 0, "batch": 0}


@given(st.integers(1, QUANTUM), st.integers(1, QUANTUM), st.integers(1, QUANTUM))
def test_tiers_share_8_4_1_and_none_starves(cu: int, cn: int, cb: int) -> None:
    queue: FairQueue[str] = FairQueue(QUANTUM)
    for _ in range(400):
        queue.push("urgent", "t", "urgent", cu)
        queue.push("normal", "t", "normal", cn)
        queue.push("batch", "t", "batch", cb)
    served: Counter[str] = Counter()
    for _ in range(300):  # all three stay backlogged throughout
        tier = queue.pop()
        served[tier] += {"urgent": cu, "normal": cn, "batch": cb}[tier]
        per_weight = (served["urgent"] / 8, served["normal"] / 4, served["batch"] / 1)
        assert max(per_weight) - min(per_weight) <= QUANTUM  # stride: within one chunk
    assert served["batch"] > 0


def test_urgent_goes_first_and_an_idle_tier_gets_no_credit() -> None:
    queue: FairQueue[str] = FairQueue(QUANTUM)
    for n in range(50):
        queue.push("batch", "t", f"b{n}", 10)
    for _ in range(20):
        queue.pop()  # batch ran alone for a while
    for n in range(20):
        queue.push("urgent", "t", f"u{n}", 10)
    order = [queue.pop() for _ in range(18)]
    assert order[0].startswith("u")
    assert sum(o.startswith("u") for o in order) >= 15  # 8:1, no burst of saved-up batch


def test_a_trickle_is_a_lone_entry_with_nothing_running() -> None:
    queue: FairQueue[str] = FairQueue(QUANTUM)
    for n in range(3):
        queue.push("batch", "big", f"big{n}", 10)  # a backlog, even with nothing running
    queue.push("normal", "small", "small0", 1)
    queue.push("batch", "small", "batch-small0", 1)
    running = {("normal", "small"): 1}
    assert queue.pop_trickle(running) == "batch-small0"  # normal's small has one running
    assert queue.pop_trickle(running) is None
    assert queue.pop_trickle({}) == "small0"
    assert queue.pop_trickle({}) is None
    assert queue.items == 30 and queue.items_of_tenant("small") == 0
    assert [queue.pop() for _ in range(3)] == ["big0", "big1", "big2"] and not queue


@given(st.lists(st.tuples(st.sampled_from(["urgent", "normal", "batch"]),
                          st.sampled_from(["a", "b", "c"]), st.integers(1, QUANTUM)),
                max_size=120),
       st.lists(st.booleans(), max_size=240),
       st.sets(st.tuples(st.sampled_from(["urgent", "normal", "batch"]),
                         st.sampled_from(["a", "b", "c"]))))
def test_trickles_and_turns_serve_everything_once(entries: list[tuple[str, str, int]],
                                                  trickle_first: list[bool],
                                                  running: set[tuple[str, str]]) -> None:
    """Taking trickles between the turns loses nothing, serves nothing twice, keeps each
    tenant's order in a tier, and takes only lone entries of tenants with none running."""
    queue: FairQueue[int] = FairQueue(QUANTUM)
    for n, (tier, tenant, cost) in enumerate(entries):
        queue.push(tier, tenant, n, cost)
    busy = {key: 1 for key in running}
    out = []
    for trickle in trickle_first + [False] * len(entries):
        if not queue:
            break
        if trickle:
            queued = Counter(entries[n][:2] for n in range(len(entries)) if n not in out)
            taken = queue.pop_trickle(busy)
            if taken is not None:
                assert queued[entries[taken][:2]] == 1 and entries[taken][:2] not in running
                out.append(taken)
            continue
        out.append(queue.pop())
    assert sorted(out) == list(range(len(entries)))
    for key in {e[:2] for e in entries}:
        mine = [n for n in out if entries[n][:2] == key]
        assert mine == sorted(mine)
    assert queue.items == 0 and len(queue) == 0


def test_tenant_weights_inside_a_tier() -> None:
    queue: FairQueue[str] = FairQueue(10, tenant_weights={"gold": 3})
    for _ in range(100):
        queue.push("normal", "gold", "gold", 10)
        queue.push("normal", "free", "free", 10)
    out = Counter(queue.pop() for _ in range(80))
    assert out["gold"] == 60 and out["free"] == 20


def test_unknown_tier_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown tier"):
        FairQueue[int]().push("vip", "t", 1, 1)
    with pytest.raises(ValueError, match="positive"):
        FairQueue[int](tier_weights={"batch": 0})


def test_pick_waiter_prefers_the_tenant_with_least_queued() -> None:
    assert pick_waiter([(1, 0, "flood"), (2, 0, "flood"), (3, 0, "trickle")],
                       {"flood": 5000, "trickle": 0}) == 3
    assert pick_waiter([(4, 1, "a"), (2, 1, "b")], {}) == 2


def test_pick_waiter_prefers_the_most_urgent_tier() -> None:
    assert pick_waiter([(1, 2, "trickle"), (2, 0, "flood"), (3, 1, "trickle")],
                       {"flood": 5000, "trickle": 0}) == 2


def test_chunk_sizer_targets_a_duration() -> None:
    sizer = ChunkSizer(target_s=0.02, min_items=8, max_items=256, first_items=32)
    assert sizer.size("b") == 32
    assert [len(c) for c in sizer.split("new", list(range(10)), spread=8)] == [2] * 5
    sizer.observe("b", 0.2, 100)  # 2 ms per item
    assert sizer.size("b") == 10
    sizer.observe("fast", 0.0001, 100)
    assert sizer.size("fast") == 256
    chunks = sizer.split("fast", list(range(1000)))
    assert [len(c) for c in chunks] == [250, 250, 250, 250]
    # a fast batch (1 ms in all) is not spread over idle workers: the hops would cost more
    assert [len(c) for c in sizer.split("fast", list(range(1000)), spread=8)] == [250] * 4
    assert [len(c) for c in sizer.split("fast", list(range(3)), spread=8)] == [3]
    assert [n for c in chunks for n in c] == list(range(1000))
    # a long one (300 x 0.2 ms = 60 ms, over the 20 ms target) is
    sizer.observe("slowish", 0.02, 100)
    assert sizer.size("slowish") == 100
    spread = sizer.split("slowish", list(range(300)), spread=8)
    assert [len(c) for c in spread] == [38] * 7 + [34]
    assert [n for c in spread for n in c] == list(range(300))


# -- the bounded queue on asyncio ---------------------------------------------------------

def chunk(tenant: str, size: int, priority: str = "normal") -> Chunk:
    binding = Binding(f"b-{tenant}", Source("kafka", "t"), "m:f", tenant=tenant,
                      priority=priority)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    return Chunk(binding, items(binding.name, size), loop.create_future())


def test_put_waits_when_full_and_the_cap_holds() -> None:
    """Urgent work may fill the whole room (a tier below leaves some to it)."""
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(QUANTUM), max_items=100)
        await queue.put(chunk("a", 60, "urgent"))
        await queue.put(chunk("a", 40, "urgent"))
        waiting = asyncio.create_task(queue.put(chunk("a", 30, "urgent")))
        await until(lambda: queue.waiting_puts == 1, message="the third put waits")
        assert not waiting.done() and queue.items == 100
        await queue.get()  # 60 out: room for 30
        await asyncio.wait_for(waiting, 1)
        assert queue.items == 70 and queue.peak_items == 100

    asyncio.run(scenario())


def test_room_goes_to_the_tenant_with_fewest_items_queued() -> None:
    """Room for one chunk of 20 frees while flood (25 queued) and trickle (none queued)
    wait, flood first: trickle's goes in, flood's waits on."""
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(QUANTUM), max_items=50)
        await queue.put(chunk("flood", 25, "urgent"))
        await queue.put(chunk("flood", 25, "urgent"))
        first = asyncio.create_task(queue.put(chunk("flood", 20, "urgent")))
        await until(lambda: queue.waiting_puts == 1, message="flood's put waits")
        second = asyncio.create_task(queue.put(chunk("trickle", 20, "urgent")))
        await until(lambda: queue.waiting_puts == 2, message="trickle's put waits")
        await queue.get()  # 25 out: room for one of the two
        await until(lambda: second.done(), message="trickle's put went in")
        assert not first.done() and queue.items == 45 and queue.waiting_puts == 1
        await queue.get()  # flood's other 25: now flood's 20 fits
        await asyncio.wait_for(first, 1)
        assert queue.items == 40

    asyncio.run(scenario())


def test_batch_leaves_room_for_urgent_work() -> None:
    """Batch fills 80% of the room and waits; normal fits up to 90%, urgent up to all of
    it, at once, though batch's put came first."""
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(QUANTUM), max_items=100)
        await queue.put(chunk("flood", 80, "batch"))
        batch = asyncio.create_task(queue.put(chunk("flood", 5, "batch")))
        await until(lambda: queue.waiting_puts == 1, message="batch's put waits")
        await asyncio.wait_for(queue.put(chunk("other", 10, "normal")), 1)
        await asyncio.wait_for(queue.put(chunk("flood", 10, "urgent")), 1)
        assert queue.items == 100 and not batch.done()
        urgent = asyncio.create_task(queue.put(chunk("flood", 5, "urgent")))
        await until(lambda: queue.waiting_puts == 2, message="urgent waits: the room is full")
        first = await queue.get()  # the urgent chunk leaves first: room for the waiting one
        assert first.binding.priority == "urgent"
        await asyncio.wait_for(urgent, 1)
        assert not batch.done(), "room freed goes to the more urgent waiter"

    asyncio.run(scenario())


def test_a_cancelled_put_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(QUANTUM), max_items=10)
        await queue.put(chunk("a", 10))
        waiting = asyncio.create_task(queue.put(chunk("b", 5)))
        await until(lambda: queue.waiting_puts == 1, message="the put waits")
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await queue.get()
        assert queue.items == 0 and queue.waiting_puts == 0

    asyncio.run(scenario())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 40)),
                min_size=1, max_size=60), st.integers(40, 200))
def test_queued_items_never_exceed_the_cap(sizes: list[tuple[str, int]], cap: int) -> None:
    async def scenario() -> None:
        queue = BoundedQueue(FairQueue(QUANTUM), max_items=cap)
        puts = [asyncio.create_task(queue.put(chunk(t, n))) for t, n in sizes]
        got = 0
        while got < len(sizes):
            await asyncio.sleep(0)
            assert queue.items <= cap
            await queue.get()
            got += 1
        await asyncio.gather(*puts)
        assert queue.peak_items <= cap

    asyncio.run(scenario())

"""The queue store against a real PostgreSQL: ordering, leases, outcomes, dead items."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asynctier.platform.errors import QueueError
from asynctier.queue import (
    MAX_PAYLOAD_BYTES,
    Dead,
    Leased,
    Nack,
    NewItem,
    QueueStore,
)
from asynctier.queue.items import new_item_id
from asynctier.queue.sql import LEASE, LEASE_RAN_OUT
from asynctier.queue.store import COPY_FROM, enqueue_in
from tests.helpers import wait_until

TOPIC = "jobs"


def db_now_ms(store: QueueStore) -> int:
    with psycopg.connect(store.dsn) as conn:
        row = conn.execute("SELECT asynctier_queue_now_ms()").fetchone()
    assert row is not None
    return int(row[0])


def fill(store: QueueStore, ns: str, count: int, topic: str = TOPIC, **kw: object) -> list[str]:
    ids = [f"i{n}" for n in range(count)]
    for start in range(0, count, 1000):
        batch = [NewItem(topic, f"p{n}".encode(), id=f"i{n}", **kw)  # type: ignore[arg-type]
                 for n in range(start, min(count, start + 1000))]
        assert all(r.created for r in store.enqueue(ns, batch))
    return ids


def lease_one(store: QueueStore, ns: str, lease_s: float = 30, owner: str = "a",
              **kw: object) -> Leased:
    got = store.lease(ns, TOPIC, 1, lease_s, owner, **kw)  # type: ignore[arg-type]
    assert len(got) == 1, got
    return got[0]


def test_lease_order_is_priority_then_deliver_after_then_enqueue_order(
        queue_store: QueueStore, queue_namespace: str) -> None:
    past = db_now_ms(queue_store) - 60_000
    items = [NewItem(TOPIC, b"", id="low", priority=-5, deliver_after_ms=past),
             NewItem(TOPIC, b"", id="mid-late", priority=0, deliver_after_ms=past + 2000),
             NewItem(TOPIC, b"", id="mid-b", priority=0, deliver_after_ms=past + 1000),
             NewItem(TOPIC, b"", id="mid-c", priority=0, deliver_after_ms=past + 1000),
             NewItem(TOPIC, b"", id="high", priority=1000, deliver_after_ms=past + 5000),
             NewItem(TOPIC, b"", id="mid-a", priority=0, deliver_after_ms=past)]
    queue_store.enqueue(queue_namespace, items)
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"", id="mid-d", priority=0,
                                                  deliver_after_ms=past + 1000)])
    order = [queue_store.lease(queue_namespace, TOPIC, 1, 30, "a")[0].id for _ in range(7)]
    assert order == ["high", "mid-a", "mid-b", "mid-c", "mid-d", "mid-late", "low"]
    assert queue_store.lease(queue_namespace, TOPIC, 10, 30, "a") == []


def test_a_batch_lease_comes_back_in_lease_order(queue_store: QueueStore,
                                                 queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"", id=str(p), priority=p)
                                          for p in (3, -1, 7, 0)])
    got = queue_store.lease(queue_namespace, TOPIC, 10, 30, "a")
    assert [g.id for g in got] == ["7", "3", "0", "-1"]
    assert all(g.attempt == 1 and g.namespace == queue_namespace for g in got)


def test_deliver_after_is_respected(queue_store: QueueStore, queue_namespace: str) -> None:
    due = db_now_ms(queue_store) + 1500
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="later",
                                                  deliver_after_ms=due)])
    assert queue_store.lease(queue_namespace, TOPIC, 5, 30, "a") == []
    [counts] = queue_store.counts(queue_namespace, TOPIC)
    assert (counts.ready, counts.delayed) == (0, 1)
    got = wait_until(lambda: queue_store.lease(queue_namespace, TOPIC, 5, 30, "a"), 10,
                     "the delayed item leased")
    assert db_now_ms(queue_store) >= due
    assert got[0].deliver_after_ms == due


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # a topic per example
@given(items=st.lists(st.tuples(st.sampled_from([-1000, -3, 0, 2, 1000]),  # priority
                                st.sampled_from(["ready", "delayed", "taken"]),
                                st.integers(0, 3)),  # how long ago it became due
                      max_size=30),
       sizes=st.lists(st.integers(1, 7), min_size=1, max_size=8))
def test_leases_take_the_ready_items_in_order_across_priorities(
        queue_store: QueueStore, queue_namespace: str,
        items: list[tuple[int, str, int]], sizes: list[int]) -> None:
    """Whatever the mix of priorities, delayed items and items another owner holds, leases
    of any size take exactly the ready items, highest priority first, then due time, then
    enqueue order."""
    ns, topic = queue_namespace, f"mix-{uuid.uuid4().hex[:8]}"
    now = db_now_ms(queue_store)
    new = [NewItem(topic, b"", id=f"i{n}", priority=p,
                   deliver_after_ms=now + 86_400_000 if state == "delayed" else now - 1000 * ago)
           for n, (p, state, ago) in enumerate(items)]
    queue_store.enqueue(ns, new)
    taken = [f"i{n}" for n, (_, state, _) in enumerate(items) if state == "taken"]
    with psycopg.connect(queue_store.dsn) as conn:  # held by another owner: their lease runs
        conn.execute("UPDATE asynctier_queue_items SET deliver_after = %s, lease_owner = 'b' "
                     "WHERE namespace = %s AND topic = %s AND id = ANY(%s)",
                     (now + 86_400_000, ns, topic, taken))
    ready = sorted((n for n, (_, state, _) in enumerate(items) if state == "ready"),
                   key=lambda n: (-items[n][0], -items[n][2], n))
    got: list[str] = []
    for size in sizes * (len(items) + 1):
        leased = queue_store.lease(ns, topic, size, 30, "a")
        assert len(leased) == min(size, len(ready) - len(got))
        got += [g.id for g in leased]
        if len(got) == len(ready):
            break
    assert got == [f"i{n}" for n in ready]
    assert queue_store.lease(ns, topic, 10, 30, "a") == []


def test_a_lease_skips_rows_locked_by_another_lease_in_every_priority(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    queue_store.enqueue(ns, [NewItem(TOPIC, b"", id=f"p{p}-{n}", priority=p)
                             for p in (9, 5, 1) for n in range(3)])
    with psycopg.connect(queue_store.dsn) as other, other.transaction():
        other.execute("SELECT 1 FROM asynctier_queue_items WHERE namespace = %s AND topic = %s "
                      "AND id IN ('p9-0', 'p9-1', 'p5-0') FOR UPDATE", (ns, TOPIC))
        got = queue_store.lease(ns, TOPIC, 4, 30, "a")
    assert [g.id for g in got] == ["p9-2", "p5-1", "p5-2", "p1-0"]


def find_node(node: dict[str, Any], name: str) -> dict[str, Any]:
    """The node of an EXPLAIN (FORMAT JSON) plan whose ``Subplan Name`` is ``name``."""
    if node.get("Subplan Name") == name:
        return node
    for child in node.get("Plans", []):
        with contextlib.suppress(LookupError):
            return find_node(child, name)
    raise LookupError(name)


def test_a_lease_does_not_read_the_delayed_items(queue_store: QueueStore,
                                                 queue_namespace: str) -> None:
    """Items delayed into the future (and leased ones) sit in the lease index after each
    priority's ready ones: the lease reads the ready ones and stops, whatever their number
    (``python -m bench.queue_scale``'s delayed case measures the drain)."""
    ns = queue_namespace
    later = db_now_ms(queue_store) + 86_400_000
    for start in range(0, 20_000, 1000):
        queue_store.enqueue(ns, [NewItem(TOPIC, b"", id=f"d{p}-{n}", priority=p,
                                         deliver_after_ms=later)
                                 for p in (0, 5) for n in range(start, start + 500)])
    queue_store.enqueue(ns, [NewItem(TOPIC, b"", id=f"r{p}-{n}", priority=p)
                             for p in (0, 5) for n in range(5)])
    with psycopg.connect(queue_store.dsn) as conn:
        conn.execute("ANALYZE asynctier_queue_items")
        cur = psycopg.ClientCursor(conn)
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + LEASE,
                    {"ns": ns, "topic": TOPIC, "n": 100, "owner": "a", "lease_ms": 30_000,
                     "max_attempts": None})
        (plan,), = cur.fetchall()
    picked = find_node(plan[0]["Plan"], "CTE picked")  # the choice, before the writes
    buffers = picked["Shared Hit Blocks"] + picked["Shared Read Blocks"]
    assert buffers < 60, f"the lease read {buffers} buffers to find 10 ready items"
    assert len(queue_store.browse(ns, TOPIC, "leased", limit=20)) == 10


@pytest.mark.parametrize("workers", [4])
def test_concurrent_leases_never_share_an_item(queue_store: QueueStore, queue_namespace: str,
                                               workers: int) -> None:
    ids = set(fill(queue_store, queue_namespace, 4000))
    leased: list[list[str]] = [[] for _ in range(workers)]
    start = threading.Barrier(workers)

    def work(n: int) -> None:
        start.wait()
        while got := queue_store.lease(queue_namespace, TOPIC, 50, 300, f"owner{n}"):
            leased[n].extend(g.id for g in got)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    everything = [i for part in leased for i in part]
    assert len(everything) == len(set(everything)) == len(ids)
    assert set(everything) == ids
    assert sum(1 for part in leased if part) >= 2, [len(p) for p in leased]


def test_an_expired_lease_is_leased_again_as_a_new_attempt(queue_store: QueueStore,
                                                           queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="e")])
    first = lease_one(queue_store, queue_namespace, lease_s=0.3, owner="old")
    assert first.attempt == 1
    assert queue_store.lease(queue_namespace, TOPIC, 1, 30, "new") == []
    [counts] = queue_store.counts(queue_namespace, TOPIC)
    assert counts.leased == 1
    again = wait_until(lambda: queue_store.lease(queue_namespace, TOPIC, 1, 30, "new"), 10,
                       "the item leased again after its lease ran out")
    assert again[0].attempt == 2
    stale = queue_store.resolve(queue_namespace, TOPIC, "old", acks=["e"])
    assert (stale.acked, stale.not_held) == (0, ("e",))
    assert queue_store.extend_lease(queue_namespace, TOPIC, "old", ["e"], 30) == []
    assert queue_store.resolve(queue_namespace, TOPIC, "new", acks=["e"]).acked == 1
    assert queue_store.get(queue_namespace, TOPIC, "e") is None


def test_max_attempts_moves_an_item_whose_last_lease_ran_out_to_dead(
        queue_store: QueueStore, queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="m")])
    for attempt in (1, 2):
        got = wait_until(lambda: queue_store.lease(queue_namespace, TOPIC, 1, 0.2, "a",
                                                   max_attempts=2), 10, "a lease")
        assert (got[0].id, got[0].attempt) == ("m", attempt)
    wait_until(lambda: db_now_ms(queue_store) > got[0].lease_expires_ms, 5, "lease expired")
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"y", id="y")])
    rest = queue_store.lease(queue_namespace, TOPIC, 5, 30, "a", max_attempts=2)
    assert [r.id for r in rest] == ["y"]
    info = queue_store.get(queue_namespace, TOPIC, "m")
    assert info is not None and info.state == "dead"
    assert (info.reason, info.last_error, info.attempts) == ("max_attempts", LEASE_RAN_OUT, 2)
    [counts] = queue_store.counts(queue_namespace, TOPIC)
    assert (counts.dead, counts.leased) == (1, 1)


def test_nack_spends_an_attempt_unless_told_not_to(queue_store: QueueStore,
                                                   queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="n")])
    lease_one(queue_store, queue_namespace)
    done = queue_store.resolve(queue_namespace, TOPIC, "a",
                               nacks=[Nack("n", 0, spend_attempt=True, error="boom")])
    assert done.nacked == 1
    assert lease_one(queue_store, queue_namespace).attempt == 2
    queue_store.resolve(queue_namespace, TOPIC, "a", nacks=[Nack("n", 0, spend_attempt=False)])
    assert lease_one(queue_store, queue_namespace).attempt == 2
    info = queue_store.get(queue_namespace, TOPIC, "n")
    assert info is not None and info.last_error == "boom"


def test_a_nack_delay_keeps_the_item_back(queue_store: QueueStore, queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="d")])
    lease_one(queue_store, queue_namespace)
    before = db_now_ms(queue_store)
    queue_store.resolve(queue_namespace, TOPIC, "a", nacks=[Nack("d", 1.0)])
    assert queue_store.lease(queue_namespace, TOPIC, 1, 30, "a") == []
    info = queue_store.get(queue_namespace, TOPIC, "d")
    assert info is not None and info.state == "delayed" and info.lease_owner is None
    assert info.deliver_after_ms is not None and info.deliver_after_ms >= before + 1000
    wait_until(lambda: queue_store.lease(queue_namespace, TOPIC, 1, 30, "a"), 10, "ready again")
    assert db_now_ms(queue_store) >= before + 1000


def test_resolve_applies_a_whole_batch_and_names_what_was_not_held(
        queue_store: QueueStore, queue_namespace: str) -> None:
    fill(queue_store, queue_namespace, 6)
    got = queue_store.lease(queue_namespace, TOPIC, 5, 30, "a")
    ids = [g.id for g in got]
    queue_store.cancel(queue_namespace, TOPIC, ids[4])
    done = queue_store.resolve(queue_namespace, TOPIC, "a", acks=ids[:2],
                               nacks=[Nack(ids[2], 60)],
                               deads=[Dead(ids[3], "rejected", "bad\x00input"),
                                      Dead(ids[4], "rejected")])
    assert (done.acked, done.nacked, done.dead, done.not_held) == (2, 1, 1, (ids[4],))
    [counts] = queue_store.counts(queue_namespace, TOPIC)
    assert (counts.ready, counts.delayed, counts.leased, counts.dead) == (1, 1, 0, 1)
    [dead] = queue_store.dead_items(queue_namespace, TOPIC)
    assert (dead.id, dead.reason, dead.error, dead.attempts) == (
        ids[3], "rejected", "bad\ufffdinput", 1)
    with pytest.raises(QueueError, match="more than once"):
        queue_store.resolve(queue_namespace, TOPIC, "a", acks=[ids[0]],
                            deads=[Dead(ids[0], "x")])


def test_extend_lease_keeps_an_item_leased(queue_store: QueueStore,
                                           queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="x")])
    first = lease_one(queue_store, queue_namespace, lease_s=0.5)
    assert queue_store.extend_lease(queue_namespace, TOPIC, "a", ["x", "gone"], 30) == ["x"]
    assert queue_store.extend_lease(queue_namespace, TOPIC, "b", ["x"], 30) == []
    wait_until(lambda: db_now_ms(queue_store) > first.lease_expires_ms + 100, 5,
               "the first lease's end passed")
    assert queue_store.lease(queue_namespace, TOPIC, 1, 30, "b") == []
    info = queue_store.get(queue_namespace, TOPIC, "x")
    assert info is not None and info.state == "leased" and info.lease_owner == "a"


def test_run_now_makes_only_a_delayed_item_due(queue_store: QueueStore,
                                               queue_namespace: str) -> None:
    ns = queue_namespace
    queue_store.enqueue(ns, [NewItem(TOPIC, b"later", id="late", delay_s=3600),
                             NewItem(TOPIC, b"now", id="now")])
    assert queue_store.get(ns, TOPIC, "late").state == "delayed"  # type: ignore[union-attr]
    assert not queue_store.run_now(ns, TOPIC, "now")  # ready already
    assert not queue_store.run_now(ns, TOPIC, "nope")
    assert queue_store.run_now(ns, TOPIC, "late")
    assert queue_store.get(ns, TOPIC, "late").state == "ready"  # type: ignore[union-attr]
    leased = queue_store.lease(ns, TOPIC, 5, 30, "w")
    assert sorted(i.id for i in leased) == ["late", "now"]
    assert not queue_store.run_now(ns, TOPIC, "late")  # leased: left to its owner
    assert queue_store.get(ns, TOPIC, "late").lease_owner == "w"  # type: ignore[union-attr]


def test_browse_lists_a_state_in_the_order_the_lease_takes_it(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    queue_store.enqueue(ns, [NewItem(TOPIC, b"low", id="low", priority=1),
                             NewItem(TOPIC, b"high", id="high", priority=9),
                             NewItem(TOPIC, b"mid", id="mid", priority=5),
                             NewItem(TOPIC, b"x" * 500, id="big", priority=5),
                             NewItem(TOPIC, b"later", id="later", delay_s=3600),
                             NewItem(TOPIC, b"kid", id="kid", after=[(TOPIC, "later")])])
    ready = queue_store.browse(ns, TOPIC, "ready")
    assert [r.id for r in ready] == ["high", "mid", "big", "low"]
    assert len(ready[2].head) == 200 and ready[0].head == b"high"
    assert [r.id for r in queue_store.browse(ns, TOPIC, "ready", limit=2, offset=2)] == [
        "big", "low"]
    assert [r.id for r in queue_store.browse(ns, TOPIC, "delayed")] == ["later"]
    (kid,) = queue_store.browse(ns, TOPIC, "waiting")
    assert (kid.id, kid.deliver_after_ms) == ("kid", None)
    queue_store.lease(ns, TOPIC, 1, 30, "w")
    (leased,) = queue_store.browse(ns, TOPIC, "leased")
    assert (leased.id, leased.lease_owner) == ("high", "w")
    with pytest.raises(QueueError, match="state 'dead'"):
        queue_store.browse(ns, TOPIC, "dead")


def test_get_cancel_counts_dead_and_replay(queue_store: QueueStore,
                                           queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [
        NewItem(TOPIC, b"body", id="g", priority=7, headers=[("k", b"v"), ("n", None)]),
        NewItem(TOPIC, b"2", id="h"), NewItem("other", b"3", id="o")])
    info = queue_store.get(queue_namespace, TOPIC, "g")
    assert info is not None
    assert (info.state, info.priority, info.payload, info.headers, info.attempts) == (
        "ready", 7, b"body", (("k", b"v"), ("n", None)), 0)
    assert queue_store.get(queue_namespace, TOPIC, "nope") is None
    got = queue_store.lease(queue_namespace, TOPIC, 2, 30, "a")
    queue_store.resolve(queue_namespace, TOPIC, "a",
                        deads=[Dead(g.id, "rejected", f"error {g.id}") for g in got])
    assert [d.id for d in queue_store.dead_items(queue_namespace, TOPIC)] == ["g", "h"]
    by_topic = {c.topic: c for c in queue_store.counts(queue_namespace)}
    assert (by_topic[TOPIC].dead, by_topic["other"].ready) == (2, 1)
    assert by_topic["other"].oldest_ready_age_s >= 0
    assert queue_store.replay(queue_namespace, TOPIC, ids=["h"]) == 1
    again = lease_one(queue_store, queue_namespace)
    assert (again.id, again.attempt) == ("h", 1)
    assert queue_store.replay(queue_namespace, TOPIC, limit=5) == 1
    assert queue_store.dead_items(queue_namespace, TOPIC) == []
    assert queue_store.cancel(queue_namespace, TOPIC, "g")
    assert not queue_store.cancel(queue_namespace, TOPIC, "g")
    assert queue_store.cancel(queue_namespace, TOPIC, "h")  # a leased one
    assert {(queue_namespace, TOPIC), (queue_namespace, "other")} <= set(queue_store.topics())


def test_generated_ids_are_hex_and_sort_in_the_order_they_were_made() -> None:
    made = []
    deadline = time.monotonic() + 5
    while len({i[:12] for i in made}) < 3 and time.monotonic() < deadline:
        made.append(new_item_id())  # at least three milliseconds' worth
    assert len({i[:12] for i in made}) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in made)
    assert len(set(made)) == len(made)
    assert [i[:12] for i in made] == sorted(i[:12] for i in made)
    assert abs(int(made[0][:12], 16) - time.time() * 1000) < 60_000


def test_duplicate_ids_are_no_ops_that_say_so(queue_store: QueueStore,
                                              queue_namespace: str) -> None:
    first = queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"1", id="same"),
                                                  NewItem(TOPIC, b"2", id="same"),
                                                  NewItem(TOPIC, b"3")])
    assert [r.created for r in first] == [True, False, True]
    assert len(first[2].id) == 32
    again = queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"4", id="same"),
                                                  NewItem("elsewhere", b"5", id="same")])
    assert [r.created for r in again] == [False, True]
    info = queue_store.get(queue_namespace, TOPIC, "same")
    assert info is not None and info.payload == b"1"


_NEW_ITEMS = st.builds(
    lambda topic, priority, when, headers, ttl_s: NewItem(
        topic, b"p", priority=priority, headers=headers, ttl_s=ttl_s,
        deliver_after_ms=when if isinstance(when, int) and when > 1000 else None,
        delay_s=when if isinstance(when, float) else None),
    st.sampled_from(["a", "b"]), st.integers(-1000, 1000),
    st.one_of(st.none(), st.floats(0, 3600), st.integers(10**12, 2 * 10**12)),
    st.lists(st.tuples(st.text(st.characters(blacklist_categories=["Cs"],
                                              blacklist_characters="\x00"),
                                min_size=1, max_size=5),
                        st.one_of(st.none(), st.binary())),
             max_size=2),
    st.one_of(st.none(), st.floats(0.001, 86_400)))


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(_NEW_ITEMS, min_size=1, max_size=5))
def test_a_batch_written_by_copy_stores_what_the_statement_stores(
        queue_store: QueueStore, queue_namespace: str, items: list[NewItem]) -> None:
    """A batch of COPY_FROM items or more is copied, a smaller one inserted by the
    statement: the same items come out of both alike (times relative to the enqueue)."""
    batch = (items * COPY_FROM)[:COPY_FROM]
    copied = queue_store.enqueue(queue_namespace, batch)
    inserted = [r for n in range(0, len(batch), 10)
                for r in queue_store.enqueue(queue_namespace, batch[n:n + 10])]
    assert all(r.created for r in copied + inserted)

    def stored(item: NewItem, item_id: str) -> tuple[object, ...]:
        info = queue_store.get(queue_namespace, item.topic, item_id)
        assert info is not None and info.deliver_after_ms is not None
        relative = info.deliver_after_ms - (0 if item.deliver_after_ms else info.enqueued_ms)
        return (info.state, info.priority, info.payload, info.headers, relative,
                None if info.expires_ms is None else info.expires_ms - info.enqueued_ms)

    for item, one, other in zip(batch[:10], copied, inserted, strict=False):
        assert stored(item, one.id) == stored(item, other.id)
        assert stored(item, one.id)[3] == tuple(item.headers)


def test_a_copied_batch_with_ids_already_there_keeps_them_and_adds_the_rest(
        queue_store: QueueStore, queue_namespace: str) -> None:
    """A COPY cannot skip an existing id: the batch is written again by the statement,
    which leaves the old item as it was and says so (a retried enqueue adds nothing)."""
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"old", id="there")])
    batch = [NewItem(TOPIC, b"new", id=f"n{n}") for n in range(COPY_FROM)]
    batch[50] = NewItem(TOPIC, b"new", id="there")
    batch[70] = NewItem(TOPIC, b"twice", id="n10")
    got = queue_store.enqueue(queue_namespace, batch)
    assert [n for n, r in enumerate(got) if not r.created] == [50, 70]
    assert queue_store.get(queue_namespace, TOPIC, "there").payload == b"old"  # type: ignore[union-attr]
    assert queue_store.get(queue_namespace, TOPIC, "n10").payload == b"new"  # type: ignore[union-attr]
    again = queue_store.enqueue(queue_namespace, batch)
    assert not any(r.created for r in again)
    [counts] = queue_store.counts(queue_namespace, TOPIC)
    assert counts.ready == COPY_FROM - 1  # "there" was there, n10 twice


def test_a_copy_that_meets_an_id_inside_a_callers_transaction_keeps_the_transaction(
        queue_store: QueueStore, queue_namespace: str) -> None:
    batch = [NewItem(TOPIC, b"", id=f"t{n}") for n in range(COPY_FROM)]
    with queue_store.transaction() as conn:
        assert all(r.created for r in enqueue_in(conn, queue_namespace, batch[:1]))
        got = enqueue_in(conn, queue_namespace, batch)
        assert [r.created for r in got] == [False] + [True] * (len(batch) - 1)
    [counts] = queue_store.counts(queue_namespace, TOPIC)
    assert counts.ready == len(batch)


def test_ttl_moves_an_unleased_item_to_dead(queue_store: QueueStore,
                                            queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"x", id="t", ttl_s=0.2)])
    info = queue_store.get(queue_namespace, TOPIC, "t")
    assert info is not None and info.expires_ms is not None
    expires = info.expires_ms
    wait_until(lambda: db_now_ms(queue_store) > expires, 5, "the ttl passed")
    assert queue_store.lease(queue_namespace, TOPIC, 1, 30, "a") == []
    [dead] = queue_store.dead_items(queue_namespace, TOPIC)
    assert dead.reason == "expired"


@pytest.mark.parametrize(("make", "message"), [
    (lambda: NewItem("bad topic", b""), "not a valid topic name"),
    (lambda: NewItem(TOPIC, b"", priority=1001), "priority 1001 is out of range"),
    (lambda: NewItem(TOPIC, b"", priority=-1001), "from -1000 to 1000"),
    (lambda: NewItem(TOPIC, b"x" * (MAX_PAYLOAD_BYTES + 1)), "over the 1,048,576-byte limit"),
    (lambda: NewItem(TOPIC, b"", id=""), "id '' is not valid"),
    (lambda: NewItem(TOPIC, b"", id="x" * 201), "1 to 200 printable"),
    (lambda: NewItem(TOPIC, b"", id="a\nb"), "printable"),
    (lambda: NewItem(TOPIC, "text"), "give bytes"),  # type: ignore[arg-type]
    (lambda: NewItem(TOPIC, b"", ttl_s=-1), "ttl_s -1 is not valid"),
    (lambda: NewItem(TOPIC, b"", headers=[("a\x00b", b"")]), "without NUL"),
    (lambda: NewItem(TOPIC, b"", headers=[("\ud800", None)]), "lone surrogates"),
])
def test_bad_items_are_refused_naming_the_item(
        queue_store: QueueStore, queue_namespace: str, make: Callable[[], NewItem],
        message: str) -> None:
    good = NewItem(TOPIC, b"ok", id="good")
    with pytest.raises(QueueError, match=message) as caught:
        queue_store.enqueue(queue_namespace, [good, make()])
    assert "item 1" in str(caught.value)
    assert queue_store.get(queue_namespace, TOPIC, "good") is None  # nothing of the batch


def test_bad_arguments_are_refused(queue_store: QueueStore, queue_namespace: str) -> None:
    with pytest.raises(QueueError, match="namespace"):
        queue_store.enqueue("bad namespace!", [])
    with pytest.raises(QueueError, match="1 to 10000"):
        queue_store.lease(queue_namespace, TOPIC, 0, 30, "a")
    with pytest.raises(QueueError, match="lease_s"):
        queue_store.lease(queue_namespace, TOPIC, 1, -1, "a")
    with pytest.raises(QueueError, match="max_attempts"):
        queue_store.lease(queue_namespace, TOPIC, 1, 30, "a", max_attempts=0)
    with pytest.raises(QueueError, match="delay_s"):
        queue_store.resolve(queue_namespace, TOPIC, "a", nacks=[Nack("x", float("nan"))])


def test_a_payload_of_the_limit_and_binary_bytes_round_trip(
        queue_store: QueueStore, queue_namespace: str) -> None:
    payload = bytes(range(256)) * (MAX_PAYLOAD_BYTES // 256)
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, payload, id="big")])
    assert lease_one(queue_store, queue_namespace).payload == payload


def test_enqueue_and_drain_are_batched(queue_store: QueueStore, queue_namespace: str) -> None:
    """10,000 items in and out in well under the time 10,000 round trips would take."""
    started = time.monotonic()
    fill(queue_store, queue_namespace, 10_000)
    drained = 0
    while got := queue_store.lease(queue_namespace, TOPIC, 500, 30, "a"):
        drained += queue_store.resolve(queue_namespace, TOPIC, "a",
                                       acks=[g.id for g in got]).acked
    assert drained == 10_000
    assert time.monotonic() - started < 30


def test_resolve_is_one_transaction(queue_store: QueueStore, queue_namespace: str) -> None:
    """A resolve whose last statement fails in the database changes nothing at all."""
    fill(queue_store, queue_namespace, 3)
    got = [g.id for g in queue_store.lease(queue_namespace, TOPIC, 3, 30, "a")]
    function = f"fail_{queue_namespace}"
    with psycopg.connect(queue_store.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN IF NEW.namespace = '{queue_namespace}' THEN "
                     "RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$")
        conn.execute(f"CREATE TRIGGER {function} BEFORE INSERT ON asynctier_queue_dead "
                     f"FOR EACH ROW EXECUTE FUNCTION {function}()")
    try:
        with pytest.raises(psycopg.Error, match="refused by the test"):
            queue_store.resolve(queue_namespace, TOPIC, "a", acks=[got[0]],
                                nacks=[Nack(got[1], 0)], deads=[Dead(got[2], "x")])
    finally:
        with psycopg.connect(queue_store.dsn, autocommit=True) as conn:
            conn.execute(f"DROP TRIGGER {function} ON asynctier_queue_dead")
            conn.execute(f"DROP FUNCTION {function}()")
    for item_id in got:
        info = queue_store.get(queue_namespace, TOPIC, item_id)
        assert info is not None and (info.state, info.lease_owner) == ("leased", "a")
    done = queue_store.resolve(queue_namespace, TOPIC, "a", acks=[got[0]],
                               nacks=[Nack(got[1], 0)], deads=[Dead(got[2], "x")])
    assert (done.acked, done.nacked, done.dead) == (1, 1, 1)


def test_a_lease_that_buries_items_still_fills_its_batch(queue_store: QueueStore,
                                                         queue_namespace: str) -> None:
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"", id=f"old{n}", ttl_s=0.1)
                                          for n in range(3)])
    expires = min(i.expires_ms or 0 for i in (queue_store.get(queue_namespace, TOPIC, f"old{n}")
                                              for n in range(3)) if i is not None)
    wait_until(lambda: db_now_ms(queue_store) > expires, 5, "the ttl passed")
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"", id=f"new{n}") for n in range(3)])
    got = queue_store.lease(queue_namespace, TOPIC, 3, 30, "a")
    assert sorted(g.id for g in got) == ["new0", "new1", "new2"]
    assert len(queue_store.dead_items(queue_namespace, TOPIC)) == 3


def test_a_leased_row_the_platform_did_not_write_goes_to_the_dead_items(
        queue_store: QueueStore, queue_namespace: str, postgres: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Stored headers that are not [[name, base64 or null], ...], or a checkpoint of an
    unknown kind, never reach a function nor stop the lease: the others are leased, those
    are dead items (undecodable) with why, each said in the log."""
    queue_store.enqueue(queue_namespace, [NewItem(TOPIC, b"1", id=i) for i in "abcd"])
    with psycopg.connect(postgres, autocommit=True) as conn:
        for item_id, column, value in [("b", "headers", '{"k": "v"}'),
                                       ("c", "headers", '[["k", "not base64!"]]')]:
            conn.execute(f"UPDATE asynctier_queue_items SET {column} = %s::jsonb "
                         "WHERE namespace = %s AND id = %s", (value, queue_namespace, item_id))
        conn.execute("UPDATE asynctier_queue_items SET checkpoint = 'x', checkpoint_kind = "
                     "'pickle' WHERE namespace = %s AND id = 'd'", (queue_namespace,))
    with caplog.at_level("ERROR", logger="asynctier.queue.store"):
        got = queue_store.lease(queue_namespace, TOPIC, 10, 30, "a")
    assert [g.id for g in got] == ["a"]
    dead = {d.id: d for d in queue_store.dead_items(queue_namespace, TOPIC)}
    assert sorted(dead) == ["b", "c", "d"]
    assert {d.reason for d in dead.values()} == {"undecodable"}
    assert "not a list" in dead["b"].error and "not base64" in dead["c"].error
    assert "'pickle'" in dead["d"].error
    assert sum("moved to the dead items" in r.getMessage() for r in caplog.records) == 3

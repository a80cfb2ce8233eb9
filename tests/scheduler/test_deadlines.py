"""Deadlines and expiry as pure logic: EDF within a tenant, no starvation, expired records."""

from __future__ import annotations

import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Deadlines, Source
from asynctier.platform.errors import BindingError
from asynctier.platform.wire import EXPIRED, Item
from asynctier.scheduler.deadlines import order_key, split_expired, stamp_deadlines
from asynctier.scheduler.queues import FairQueue


def _item(i: int, record_ms: int, deadline_ms: int | None = None) -> Item:
    return {"id": i, "binding": "b", "payload": b"{}", "key": None, "headers": [],
            "attempt": 1, "source_ref": "", "record_time_ms": record_ms, "priority": 0,
            "deadline_ms": deadline_ms}


def test_within_a_tenant_the_earliest_deadline_leaves_first() -> None:
    fair: FairQueue[str] = FairQueue(quantum=4)
    fair.push("normal", "t", "far-1", 1, deadline=3600.0)
    fair.push("normal", "t", "far-2", 1, deadline=3601.0)
    fair.push("normal", "t", "near", 1, deadline=1.0)
    fair.push("normal", "t", "none", 1)  # no deadline: after every one that has one
    assert [fair.pop() for _ in range(4)] == ["near", "far-1", "far-2", "none"]


def test_equal_deadlines_leave_in_the_order_they_came() -> None:
    fair: FairQueue[int] = FairQueue(quantum=4)
    for n in range(10):
        fair.push("normal", "t", n, 1, deadline=5.0)
    assert [fair.pop() for _ in range(10)] == list(range(10))


def test_far_work_is_not_starved_once_near_work_stops() -> None:
    """A stream of near deadlines goes first; the far backlog drains as soon as it stops."""
    fair: FairQueue[str] = FairQueue(quantum=4)
    for n in range(5):
        fair.push("normal", "t", f"far-{n}", 1, deadline=3600.0 + n)
    served = []
    for now in range(3):  # near work keeps arriving while capacity is short
        fair.push("normal", "t", f"near-{now}", 1, deadline=now + 1.0)
        served.append(fair.pop())
    assert served == ["near-0", "near-1", "near-2"]
    assert [fair.pop() for _ in range(5)] == [f"far-{n}" for n in range(5)]


def test_edf_does_not_override_tenant_fairness_or_tiers() -> None:
    fair: FairQueue[str] = FairQueue(quantum=1)
    for n in range(4):
        fair.push("normal", "a", f"a{n}", 1, deadline=1.0)
        fair.push("normal", "b", f"b{n}", 1, deadline=9999.0)
    got = [fair.pop() for _ in range(8)]
    assert sorted(got[:2]) == ["a0", "b0"]  # b's far deadlines still get their share


def test_stamp_gives_record_time_plus_window_and_keeps_a_source_deadline() -> None:
    b = Binding("b", Source("kafka", "t"), "m:f", deadlines=Deadlines(start_within_s=5.0))
    items = [_item(0, 1_000), _item(1, 1_000, deadline_ms=2_000)]
    stamp_deadlines(b, items)
    assert [i["deadline_ms"] for i in items] == [6_000, 2_000]
    assert order_key(b, items, now_s=100.0, default_window_s=60.0) == 2.0


def test_without_a_window_a_chunk_is_due_the_default_window_after_it_arrived() -> None:
    b = Binding("b", Source("kafka", "t"), "m:f")
    items = [_item(0, 1_000)]
    stamp_deadlines(b, items)
    assert items[0]["deadline_ms"] is None
    assert order_key(b, items, now_s=100.0, default_window_s=60.0) == 160.0


def test_records_past_their_expiry_fail_expired_and_the_rest_live() -> None:
    b = Binding("b", Source("kafka", "t"), "m:f", deadlines=Deadlines(expire_after_s=2.0))
    items = [_item(0, 10_000), _item(1, 7_999), _item(2, 8_001)]
    dead, live = split_expired(b, items, now_ms=10_000)
    assert [o["id"] for o in dead] == [1]
    assert dead[0]["status"] == "failed" and dead[0]["reason"] == EXPIRED
    assert "--expire-after 2s" in (dead[0]["error"] or "")
    assert [i["id"] for i in live] == [0, 2]


def test_a_binding_without_expiry_never_expires() -> None:
    b = Binding("b", Source("kafka", "t"), "m:f")
    items = [_item(0, 0)]
    assert split_expired(b, items, now_ms=10**12) == ([], items)


def test_expiry_shorter_than_the_start_window_is_refused() -> None:
    with pytest.raises(BindingError, match="expire after"):
        Binding("b", Source("kafka", "t"), "m:f",
                deadlines=Deadlines(start_within_s=60.0, expire_after_s=5.0)).validate()
    Binding("b", Source("kafka", "t"), "m:f",
            deadlines=Deadlines(start_within_s=1.0, expire_after_s=5.0)).validate()


def test_deadline_fields_survive_the_bindings_topic() -> None:
    b = Binding("b", Source("kafka", "t"), "m:f",
                deadlines=Deadlines(start_within_s=1.5, expire_after_s=60.0))
    assert Binding.decode(b.encode()) == b

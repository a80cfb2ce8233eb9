"""Schedules as values: ticks (cron in a time zone, daylight saving), the catch-up plan,
and the checks that refuse a bad schedule with a message that says what to fix."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asynctier.platform.errors import QueueError, ScheduleError
from asynctier.schedules.spec import Schedule, iso, plan

PARIS = ZoneInfo("Europe/Paris")


def ms(*args: int, tz: ZoneInfo = PARIS, fold: int = 0) -> int:
    return round(datetime(*args, tzinfo=tz, fold=fold).timestamp() * 1000)  # type: ignore[misc]


def cron(expr: str, tz: str = "Europe/Paris", **kw: object) -> Schedule:
    return Schedule(namespace="ns", name="s", topic="t", cron=expr, timezone=tz,
                    **kw)  # type: ignore[arg-type]


def every(seconds: int, **kw: object) -> Schedule:
    return Schedule(namespace="ns", name="s", topic="t", every_s=seconds,
                    **kw)  # type: ignore[arg-type]


def ticks(s: Schedule, start_ms: int, n: int) -> list[int]:
    out = [s.after(start_ms)]
    while len(out) < n:
        out.append(s.after(out[-1]))
    return out


def test_spring_forward_a_daily_tick_in_the_skipped_hour_runs_once_at_its_end() -> None:
    # 2025-03-30, Paris: 02:00 -> 03:00. A 02:30 job runs at 03:00 that day (cron's rule).
    got = ticks(cron("30 2 * * *"), ms(2025, 3, 29, 12, 0), 3)
    assert got == [ms(2025, 3, 30, 3, 0), ms(2025, 3, 31, 2, 30), ms(2025, 4, 1, 2, 30)]


def test_spring_forward_a_job_every_half_hour_skips_the_missing_hour() -> None:
    got = ticks(cron("*/30 * * * *"), ms(2025, 3, 30, 1, 0), 3)
    assert got == [ms(2025, 3, 30, 1, 30), ms(2025, 3, 30, 3, 0), ms(2025, 3, 30, 3, 30)]
    assert got[1] - got[0] == 30 * 60_000  # 01:30 CET to 03:00 CEST is half an hour


def test_fall_back_a_daily_tick_in_the_repeated_hour_runs_once() -> None:
    # 2025-10-26, Paris: 03:00 -> 02:00. The 02:30 job runs once, in the first copy.
    got = ticks(cron("30 2 * * *"), ms(2025, 10, 25, 12, 0), 2)
    assert got == [ms(2025, 10, 26, 2, 30, fold=0), ms(2025, 10, 27, 2, 30)]


def test_fall_back_a_job_every_half_hour_runs_in_both_copies_of_the_hour() -> None:
    got = ticks(cron("*/30 * * * *"), ms(2025, 10, 26, 1, 45), 5)
    assert got == [ms(2025, 10, 26, 2, 0, fold=0), ms(2025, 10, 26, 2, 30, fold=0),
                   ms(2025, 10, 26, 2, 0, fold=1), ms(2025, 10, 26, 2, 30, fold=1),
                   ms(2025, 10, 26, 3, 0)]
    assert all(b - a == 30 * 60_000 for a, b in itertools.pairwise(got))


def test_a_cron_is_read_in_its_time_zone() -> None:
    assert cron("0 9 * * *", "UTC").after(ms(2026, 1, 5, 0, 0, tz=ZoneInfo("UTC"))) == \
        ms(2026, 1, 5, 9, 0, tz=ZoneInfo("UTC"))
    assert cron("0 9 * * *", "Asia/Tokyo").after(ms(2026, 1, 5, 0, 0, tz=ZoneInfo("UTC"))) == \
        ms(2026, 1, 6, 0, 0, tz=ZoneInfo("UTC"))


def test_every_ticks_at_multiples_of_its_interval_since_the_epoch() -> None:
    assert every(30).after(1_000_000_001) == 1_000_020_000
    assert every(30).after(1_000_020_000) == 1_000_050_000


@given(st.integers(1, 3600), st.integers(0, 2**41))
def test_after_is_strictly_later_and_the_next_tick(step: int, t: int) -> None:
    nxt = every(step).after(t)
    assert t < nxt <= t + step * 1000 and nxt % (step * 1000) == 0


def test_the_tick_payload_and_id_carry_the_tick() -> None:
    s = every(60, payload='{"kind": "nightly"}')
    assert s.tick_payload(1_800_000_000_000) == (
        b'{"kind":"nightly","schedule":"s","tick":"2027-01-15T08:00:00Z",'
        b'"tick_ms":1800000000000}')
    assert s.item_id(1_800_000_000_000) == "schedule:s:2027-01-15T08:00:00Z"
    assert iso(1_800_000_000_250) == "2027-01-15T08:00:00.250Z"


# ---------------------------------------------------------------- catch-up

DOWN_FROM = 1_000_000_020_000  # a tick of every(60)


def test_catch_up_none_fires_only_the_ticks_within_grace() -> None:
    s = every(60, catch_up="none", grace_s=10)
    now = DOWN_FROM + 180_000 + 5_000  # three minutes down; the 4th tick is 5 s late
    p = plan(s, DOWN_FROM, now)
    assert p.fire == (DOWN_FROM + 180_000,)
    assert p.skipped == 3
    assert p.next_ms == DOWN_FROM + 240_000


def test_catch_up_last_fires_the_latest_missed_tick() -> None:
    p = plan(every(60, catch_up="last", grace_s=1), DOWN_FROM, DOWN_FROM + 180_000 + 5_000)
    assert p.fire == (DOWN_FROM + 180_000,) and p.skipped == 3


def test_catch_up_all_fires_each_missed_tick_up_to_its_bound() -> None:
    s = every(60, catch_up="all", grace_s=1)
    now = DOWN_FROM + 180_000 + 5_000
    assert plan(s, DOWN_FROM, now).fire == tuple(DOWN_FROM + k * 60_000 for k in range(4))
    bounded = plan(every(60, catch_up="all", catch_up_max=2, grace_s=1), DOWN_FROM, now)
    assert bounded.fire == (DOWN_FROM + 120_000, DOWN_FROM + 180_000)
    assert bounded.skipped == 2


def test_a_long_outage_is_not_walked_tick_by_tick_past_the_scan_bound() -> None:
    s = every(1, catch_up="all", catch_up_max=5, grace_s=2)
    now = DOWN_FROM + 86_400_000  # a day of 1 s ticks
    p = plan(s, DOWN_FROM, now, scan_max=1000)
    assert len(p.fire) == 5 + 3  # the bound's latest missed, then the 3 within grace
    assert p.fire[-1] == now and p.next_ms == now + 1000


@given(st.integers(1, 120), st.integers(0, 500), st.sampled_from(["none", "last", "all"]),
       st.integers(0, 30))
def test_a_plan_fires_each_due_tick_at_most_once_and_moves_past_now(
        step: int, down_ticks: int, catch_up: str, grace: int) -> None:
    s = every(step, catch_up=catch_up, grace_s=grace)
    start = DOWN_FROM - DOWN_FROM % (step * 1000)
    now = start + down_ticks * step * 1000 + 7
    p = plan(s, start, now)
    assert list(p.fire) == sorted(set(p.fire))
    assert all(start <= t <= now for t in p.fire)
    assert now < p.next_ms <= now + step * 1000
    assert len(p.fire) + p.skipped == down_ticks + 1


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("kw", "says"), [
    ({"cron": "*/5 * * *"}, "give five fields"),
    ({"cron": "61 * * * *"}, "is not valid"),
    ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "time zone 'Mars/Olympus' is unknown"),
    ({"every_s": 0}, "at least 1s"),
    ({}, "exactly one of --cron or --every"),
    ({"cron": "* * * * *", "every_s": 5}, "exactly one of --cron or --every"),
    ({"every_s": 5, "payload": "[1]"}, "give a JSON object"),
    ({"every_s": 5, "payload": "{oops"}, "the payload is not JSON"),
    ({"every_s": 5, "payload": '{"tick": 1}'}, "which each tick sets"),
    ({"every_s": 5, "catch_up": "some"}, "--catch-up 'some'"),
    ({"every_s": 5, "priority": 5000}, "priority 5000 is out of range"),
])
def test_a_bad_schedule_is_refused_saying_what_to_fix(kw: dict[str, object], says: str) -> None:
    with pytest.raises(ScheduleError, match=None) as caught:
        Schedule(namespace="ns", name="s", topic="t", **kw)  # type: ignore[arg-type]
    assert says in str(caught.value)


def test_bad_names_and_topics_are_refused() -> None:
    with pytest.raises(ScheduleError, match="schedule name"):
        every(5).__class__(namespace="ns", name="no spaces", topic="t", every_s=5)
    with pytest.raises(QueueError, match="not a valid topic name"):
        Schedule(namespace="ns", name="s", topic="bad topic", every_s=5)

"""The ladder planner (pure code): examples, and properties checked by hypothesis."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.delay_streams.ladder import ladder_delay, next_hop, plan_hops
from asynctier.delay_streams.pauses import PauseBook, release_at_ms

DEFAULT = (30.0, 60.0, 300.0, 1800.0)
EPS = 1e-6

# Ladders as Binding allows them: 1-10 strictly increasing steps from 0.5 s to 7 days.
steps_s = st.integers(min_value=1, max_value=14 * 86400).map(lambda half_s: half_s / 2)
ladders = st.lists(steps_s, min_size=1, max_size=10, unique=True).map(sorted)
# Ladders whose neighbouring steps differ by at most 16x (the default's largest ratio is 6):
# with a wider gap, "late by less than the smallest step" needs many small hops.
gentle_ladders = st.tuples(
    st.integers(1, 120).map(lambda half_s: half_s / 2),
    st.lists(st.integers(2, 16), min_size=0, max_size=5),
).map(lambda first_ratios: [first_ratios[0] * math.prod(first_ratios[1][:i])
                            for i in range(len(first_ratios[1]) + 1)])
#: A delay as a multiple of the ladder's largest step (up to 50 of them).
delays = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(delay=st.floats(min_value=0.0, max_value=3600.0, allow_nan=False), ladder=ladders)
def test_any_valid_ladder_is_never_early_and_late_by_less_than_its_smallest_step(
        delay: float, ladder: list[float]) -> None:
    total = sum(plan_hops(delay, ladder))
    assert delay - EPS <= total < delay + min(ladder) + EPS


def hop_bound(delay_s: float, ladder: list[float]) -> int:
    """At most delay/largest hops of the largest step, fewer than next/step of each smaller
    one, and one to cover the remainder."""
    steps = sorted(set(ladder), reverse=True)
    smaller = sum(math.ceil(bigger / step) - 1 for bigger, step in itertools.pairwise(steps))
    return math.floor(delay_s / steps[0]) + smaller + 1


def test_examples() -> None:
    assert plan_hops(7, [1, 2, 4]) == [4, 2, 1]
    assert plan_hops(45, DEFAULT) == [60]
    assert plan_hops(30, DEFAULT) == [30]
    assert plan_hops(0, DEFAULT) == []
    assert plan_hops(-3, DEFAULT) == []
    assert plan_hops(0.2, [1, 2, 4]) == [1]
    assert plan_hops(3600 + 61, DEFAULT) == [1800, 1800, 60, 30]
    assert next_hop(7, [1, 2, 4]) == 4
    assert next_hop(0, [1, 2, 4]) is None


def test_ladder_delay_repeats_the_last_step() -> None:
    assert [ladder_delay(a, DEFAULT) for a in range(1, 7)] == [30, 60, 300, 1800, 1800, 1800]
    assert ladder_delay(0, DEFAULT) == 30
    with pytest.raises(ValueError):
        ladder_delay(1, [])
    with pytest.raises(ValueError):
        plan_hops(5, [])


@settings(max_examples=300, deadline=None)
@given(delay=delays, ladder=gentle_ladders)
def test_a_plan_is_never_early(delay: float, ladder: list[float]) -> None:
    delay *= max(ladder)
    assert sum(plan_hops(delay, ladder)) >= delay - EPS


@settings(max_examples=300, deadline=None)
@given(delay=delays, ladder=gentle_ladders)
def test_a_plan_is_late_by_less_than_the_smallest_step(delay: float, ladder: list[float]) -> None:
    delay *= max(ladder)
    assert sum(plan_hops(delay, ladder)) - delay < min(ladder) + EPS


@settings(max_examples=300, deadline=None)
@given(delay=delays, ladder=gentle_ladders)
def test_a_plan_has_few_hops_largest_first(delay: float, ladder: list[float]) -> None:
    delay *= max(ladder)
    hops = plan_hops(delay, ladder)
    assert hops == sorted(hops, reverse=True)
    assert set(hops) <= set(ladder)
    assert len(hops) <= hop_bound(delay, ladder)


@settings(max_examples=300, deadline=None)
@given(delay=st.floats(min_value=0.0, max_value=7 * 86400.0, allow_nan=False))
def test_doubling_and_default_ladders_take_few_hops(delay: float) -> None:
    assert len(plan_hops(delay, [1, 2, 4])) <= delay // 4 + 2
    assert len(plan_hops(delay, DEFAULT)) <= delay // 1800 + 10


@settings(max_examples=300, deadline=None)
@given(delay=st.floats(min_value=0.001, max_value=1.0, allow_nan=False), ladder=gentle_ladders,
       slack=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=64))
def test_replanning_at_each_hop_is_never_early_and_late_by_less_than_smallest_plus_slack(
        delay: float, ladder: list[float], slack: list[float]) -> None:
    """The delay tailer re-plans from the remaining time after each hop; each hop also
    costs some polling slack. The record leaves no earlier than due, and is late by less
    than the smallest step plus the last hop's slack."""
    delay *= 20 * max(ladder)
    now, hops = 0.0, 0
    while True:
        hop = next_hop(delay - now, ladder)
        if hop is None:
            break
        jitter = slack[hops % len(slack)]
        now += hop + jitter
        hops += 1
        assert hops <= hop_bound(delay, ladder) + 1
    assert now >= delay - EPS
    assert now - delay < min(ladder) + max(slack) + EPS


@given(ts=st.integers(0, 2**41), interval=st.integers(500, 86400_000),
       due=st.integers(0, 2**42))
def test_a_delay_record_never_leaves_before_its_timestamp_plus_interval(
        ts: int, interval: int, due: int) -> None:
    at = release_at_ms(ts, interval, due)
    assert at >= ts + interval
    assert at == ts + interval or at == due


def test_pause_book() -> None:
    book = PauseBook()
    assert book.wait_s(1000, 1.0) == 1.0
    book.pause(3, 1500)
    book.pause(1, 1200)
    assert book.is_paused(3) and book.paused == [1, 3]
    assert book.wait_s(1000, 1.0) == pytest.approx(0.2)
    assert book.wait_s(2000, 1.0) == 0.0
    assert book.take_due(1200) == [1]
    book.forget([3])
    assert book.paused == [] and book.take_due(10**9) == []

"""Placement of calls in regions: the pure logic (home first, spill cap), with a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError
from asynctier.platform.placement import (
    HOME,
    NO_HOME,
    SPILL,
    Placement,
    SpillCap,
    Spot,
    region_order,
)


def spot(address: str, region: str, load: int = 0, capacity: int = 10) -> Spot:
    return Spot(address, region, load, capacity)


def test_home_with_room_keeps_every_call_home() -> None:
    place = Placement("a", share=1.0, window=10)
    spots = [spot("a1", "a", load=10), spot("a2", "a", load=3), spot("b1", "b")]
    for _ in range(50):
        choice = place.choose(spots)
        assert choice is not None
        assert (choice.region, choice.addresses, choice.reason) == ("a", ["a2"], HOME)


def test_a_full_home_spills_up_to_the_cap_then_waits_home() -> None:
    place = Placement("a", share=0.3, window=10)
    spots = [spot("a1", "a", load=10), spot("a2", "a", load=12), spot("b1", "b")]
    reasons = [c.reason for c in (place.choose(spots) for _ in range(40)) if c is not None]
    assert reasons[:3] == [SPILL] * 3  # the budget is spent first ...
    for start in range(len(reasons) - 9):  # ... and no 10 calls in a row hold more than 3
        assert reasons[start:start + 10].count(SPILL) <= 3
    assert reasons.count(SPILL) == 12  # 3 per 10 calls, used in full


def test_an_unknown_capacity_is_never_full() -> None:
    assert not spot("x", "a", load=10**9, capacity=0).full
    assert spot("x", "a", load=10, capacity=10).full


def test_no_live_home_scheduler_sends_everything_away_whatever_the_cap() -> None:
    place = Placement("a", share=0.0, window=10, order=("c",))
    spots = [spot("b1", "b"), spot("c1", "c"), spot("c2", "c", load=10)]
    for _ in range(30):
        choice = place.choose(spots)
        assert choice is not None
        assert (choice.region, choice.addresses, choice.reason) == ("c", ["c1"], NO_HOME)
    assert place.cap.away == 0  # not counted against the cap
    back = place.choose([spot("a1", "a"), *spots])  # a home scheduler is back: home at once
    assert back is not None and back.reason == HOME


def test_no_home_with_every_region_full_still_goes_away() -> None:
    place = Placement("a", share=0.5, window=10)
    choice = place.choose([spot("c1", "c", load=10), spot("b1", "b", load=10)])
    assert choice is not None and (choice.region, choice.addresses) == ("b", ["b1"])


def test_nothing_live_anywhere_is_none() -> None:
    assert Placement("a", 0.5, 10).choose([]) is None


def test_spill_goes_to_the_preferred_region_with_room() -> None:
    place = Placement("a", share=1.0, window=10, order=("c", "b"))
    full_home = [spot("a1", "a", load=10)]
    to_c = place.choose([*full_home, spot("b1", "b"), spot("c1", "c")])
    assert to_c is not None and to_c.region == "c"
    to_b = place.choose([*full_home, spot("b1", "b"), spot("c1", "c", load=10)])
    assert to_b is not None and to_b.region == "b"
    stays = place.choose([*full_home, spot("b1", "b", load=10)])
    assert stays is not None and (stays.region, stays.reason) == ("a", HOME)


def test_region_order_puts_preferred_first_then_by_name() -> None:
    assert region_order("a", {"a", "d", "c", "b"}, ("c", "zz", "c")) == ["c", "b", "d"]


def test_spill_cap_budget_and_bounds() -> None:
    assert SpillCap(0.5, 100).budget == 50
    assert SpillCap(0.29, 100).budget == 29  # no float rounding below the share
    assert SpillCap(0.0, 10).allows() is False
    with pytest.raises(ValueError):
        SpillCap(1.5, 10)


def test_region_settings_from_file_and_environment() -> None:
    doc = {"asynctier": {"region": "eu-west", "spill_share": 0.25, "spill_window": 40,
                         "spill_order": ["us-east"]},
           "scheduler": {"max_queued_items": 64}}
    s = Settings.from_mapping(doc)
    assert (s.region, s.spill_share, s.spill_window, s.spill_order,
            s.scheduler_max_queued) == ("eu-west", 0.25, 40, ("us-east",), 64)
    env = s.from_env({"ASYNCTIER_REGION": "us-east", "ASYNCTIER_SPILL_SHARE": "0",
                      "ASYNCTIER_SPILL_ORDER": "eu-west, ap-south"})
    assert (env.region, env.spill_share, env.spill_order) == ("us-east", 0.0,
                                                              ("eu-west", "ap-south"))
    assert Settings().region == "local"
    with pytest.raises(ConfigError, match="region name"):
        Settings.from_mapping({"asynctier": {"region": "eu west"}})
    with pytest.raises(ConfigError, match="spill_share"):
        Settings.from_mapping({"asynctier": {"spill_share": 2}})
    with pytest.raises(ConfigError, match="ASYNCTIER_REGION"):
        Settings().from_env({"ASYNCTIER_REGION": "a/b"})


# --- the property -------------------------------------------------------------------------

REGIONS = ("a", "b", "c")
spots_strategy = st.lists(
    st.builds(Spot, address=st.sampled_from([f"s{i}" for i in range(6)]),
              region=st.sampled_from(REGIONS), load=st.integers(0, 12),
              capacity=st.sampled_from([0, 5, 10])),
    max_size=6, unique_by=lambda s: s.address)


@settings(max_examples=80, deadline=None)
@given(share=st.floats(0.0, 1.0), window=st.integers(1, 30),
       views=st.lists(spots_strategy, min_size=1, max_size=40))
def test_property_spill_never_exceeds_the_cap_and_never_leaves_a_home_with_room(
        share: float, window: int, views: list[list[Spot]]) -> None:
    place = Placement("a", share, window)
    budget = SpillCap(share, window).budget
    counted: list[bool] = []  # the home-or-spill decisions, in order
    for view in views:
        choice = place.choose(view)
        home = [s for s in view if s.region == "a"]
        if not view:
            assert choice is None
            continue
        assert choice is not None
        assert set(choice.addresses) <= {s.address for s in view if s.region == choice.region}
        if any(not s.full for s in home):
            assert choice.reason == HOME  # nothing goes away while home has room
            assert not any(view_spot.full for view_spot in view
                           if view_spot.address in choice.addresses)
        if not home:
            assert choice.reason == NO_HOME and choice.region != "a"
            continue
        assert choice.reason in (HOME, SPILL)
        counted.append(choice.reason == SPILL)
        assert sum(counted[-window:]) <= budget  # every window holds at most the cap

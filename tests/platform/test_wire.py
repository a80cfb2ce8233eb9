"""The submit call's encoding: whatever goes in comes out, item for item."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.platform import wire

_bytes = st.one_of(st.none(), st.binary(max_size=64))
_text = st.characters(blacklist_categories=("Cs",))  # UTF-8 has no lone surrogates
_header = st.fixed_dictionaries({"name": st.text(_text, max_size=8), "value": _bytes})
_ref = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
               max_size=20)


@st.composite
def _items(draw: st.DrawFn) -> list[wire.Item]:
    n = draw(st.integers(0, 30))
    ids = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n, unique=True))
    return [{
        "id": ident,
        "binding": draw(st.sampled_from(["a", "b", "c-1"])),
        "payload": draw(_bytes),
        "key": draw(_bytes),
        "headers": draw(st.lists(_header, max_size=3)),
        "attempt": draw(st.integers(1, 100)),
        "source_ref": draw(_ref),
        "record_time_ms": draw(st.integers(0, 2**62)),
        "priority": draw(st.sampled_from([0, 0, 5, -3, 1000])),
        "deadline_ms": draw(st.one_of(st.none(), st.integers(0, 2**62))),
    } for ident in ids]


@settings(max_examples=200)
@given(_items())
def test_items_round_trip(items: list[wire.Item]) -> None:
    assert wire.decode_items(wire.encode_items(items)) == items


@given(st.lists(st.booleans(), max_size=30))
def test_fresh_flags_travel_item_for_item_and_a_call_of_items_has_none(
        flags: list[bool]) -> None:
    cols = wire.Columns()
    for n, fresh in enumerate(flags):
        cols.add("a", b"x", None, None, 1, f"t/0/{n}", 0, fresh=fresh)
    items = wire.decode_items(cols.encode())
    assert [i.get("fresh", False) for i in items] == flags
    assert not any(i.get("fresh") for i in wire.decode_items(wire.encode_items(items)))


def test_fresh_flags_that_are_not_one_per_item_are_refused() -> None:
    cols = wire.Columns()
    cols.add("a", b"x", None, None, 1, "t/0/0", 0, fresh=True)
    cols.add("a", b"y", None, None, 1, "t/0/1", 0)
    cols.fresh = bytearray(b"\x01")  # one flag for two items
    try:
        wire.decode_items(cols.encode())
    except ValueError as exc:
        assert "1 fresh flags for 2 items" in str(exc)
    else:
        raise AssertionError("a call with one flag for two items was read")


_outcome = st.one_of(
    st.builds(wire.ok, st.integers(0, 2**40)),
    st.builds(wire.failed, st.integers(0, 2**40), st.text(_text, max_size=30),
              st.sampled_from([wire.REJECTED, wire.UNDECODABLE, wire.TOO_LARGE])),
    st.builds(wire.retry, st.integers(0, 2**40), st.text(_text, max_size=30),
              st.one_of(st.none(), st.floats(0, 1e6)), st.booleans(),
              st.sampled_from([None, wire.TIMEOUT])),
)


@settings(max_examples=200)
@given(st.lists(_outcome, max_size=40, unique_by=lambda o: o["id"]))
def test_outcomes_round_trip(outcomes: list[wire.Outcome]) -> None:
    got = wire.decode_outcomes(wire.encode_outcomes(outcomes))
    assert sorted(got, key=lambda o: o["id"]) == sorted(outcomes, key=lambda o: o["id"])


def test_a_source_ref_with_a_newline_is_refused() -> None:
    cols = wire.Columns()
    cols.add("a", b"x", None, None, 1, "bad\nref", 0)
    try:
        cols.encode()
    except ValueError as exc:
        assert "newline" in str(exc)
    else:
        raise AssertionError("a newline in a source_ref was accepted")

"""Outcome replies are checked before a tailer acts on them (``platform/replies.py``), and
a weight that is no weight never makes the fair queue spin (pure logic, no services)."""

from __future__ import annotations

import contextlib
import math
import struct

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from asynctier.platform import wire
from asynctier.platform.errors import BadReply
from asynctier.platform.replies import KNOWN_REASONS, read_outcomes
from asynctier.scheduler.limits.tenants import parse_weight
from asynctier.scheduler.queues import TenantDRR

N = 6


def _reply(outcomes: list[wire.Outcome]) -> bytes:
    return wire.encode_outcomes(outcomes)


def _all_ok(ids: list[int]) -> bytes:
    return _reply([wire.ok(i) for i in ids])


def test_a_whole_answer_in_any_order_is_taken() -> None:
    outcomes = read_outcomes(_reply([wire.retry(3, "E", 5.0), wire.ok(0), wire.ok(1),
                                     wire.failed(2, "bad", wire.UNDECODABLE), wire.ok(4),
                                     wire.ok(5)]), range(N))
    assert sorted(o["id"] for o in outcomes) == list(range(N))


@pytest.mark.parametrize(("ids", "says"), [
    ([0, 1, 2, 3, 4, N], "did not send"),  # out of range
    ([-1, 1, 2, 3, 4, 5], "did not send"),  # negative
    ([0, 0, 1, 2, 3, 4, 5], "more than once"),  # duplicate
    ([0, 1, 2, 3, 4], "none for [5]"),  # missing
])
def test_an_answer_naming_the_wrong_items_is_refused(ids: list[int], says: str) -> None:
    with pytest.raises(BadReply, match=says.replace("[", r"\[").replace("]", r"\]")):
        read_outcomes(_all_ok(ids), range(N))


@pytest.mark.parametrize("outcome", [
    wire.retry(0, "E", math.nan), wire.retry(0, "E", math.inf),
    wire.retry(0, "E", 400 * 86400.0), wire.failed(0, "E", "made_up_reason"),
], ids=["nan", "inf", "over-a-year", "unknown-reason"])  # (a negative delay reads as none)
def test_an_answer_with_a_value_out_of_range_is_refused(outcome: wire.Outcome) -> None:
    with pytest.raises(BadReply, match="item 0"):
        read_outcomes(_reply([outcome]), range(1))


def test_garbage_bytes_are_refused_saying_so() -> None:
    with pytest.raises(BadReply, match="does not decode"):
        read_outcomes(b"\xff garbage \x00" * 3, range(N))


def test_a_stream_message_may_answer_some_items_but_each_once() -> None:
    waiting = {0, 1, 2, 3}
    assert [o["id"] for o in read_outcomes(_all_ok([2]), waiting, whole=False)] == [2]
    with pytest.raises(BadReply, match="did not send or that were answered already"):
        read_outcomes(_all_ok([7]), waiting, whole=False)


_reason = st.one_of(st.none(), st.sampled_from(sorted(KNOWN_REASONS)), st.text(max_size=8))
_after = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
_outcome = st.builds(
    lambda i, kind, after, reason, spends: (
        wire.ok(i) if kind == "ok" else
        {"id": i, "status": kind, "after_s": after, "error": "E", "spends_attempt": spends,
         "reason": reason}),
    st.integers(-3, N + 3), st.sampled_from(["ok", "retry", "failed"]), _after, _reason,
    st.booleans())


@hsettings(max_examples=600, deadline=None)
@given(st.lists(_outcome, max_size=N + 4))
def test_hypothesis_answers_are_taken_only_when_sound(outcomes: list[wire.Outcome]) -> None:
    """Whatever a scheduler sends, the tailer gets one outcome per item with sane values,
    or BadReply: never a partial answer, never another exception."""
    try:
        got = read_outcomes(_reply(outcomes), range(N))
    except BadReply:
        return
    assert sorted(o["id"] for o in got) == list(range(N))
    for o in got:
        assert o["status"] in ("ok", "retry", "failed")
        assert o["reason"] is None or o["reason"] in KNOWN_REASONS
        assert o["after_s"] is None or 0 <= o["after_s"] <= 365 * 86400


@hsettings(max_examples=600, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 40))
def test_hypothesis_random_or_cut_bytes_are_bad_replies(noise: bytes, cut: int) -> None:
    """Random bytes, and a sound reply cut short or with bytes flipped, never raise
    anything but BadReply."""
    sound = _reply([wire.ok(i) for i in range(N - 1)] + [wire.retry(N - 1, "E", 1.0)])
    for data in (noise, sound[:cut], sound[:cut] + noise, _flip(sound, cut, noise)):
        with contextlib.suppress(BadReply):
            read_outcomes(data, range(N))


def _flip(data: bytes, at: int, noise: bytes) -> bytes:
    at %= len(data)
    return data[:at] + bytes([(data[at] ^ (noise[:1] or b"\x01")[0]) or 1]) + data[at + 1:]


def test_a_packed_column_of_the_wrong_length_is_a_bad_reply() -> None:
    """Columns that disagree (more ids than delays) are refused, not an exception."""
    good = wire.encode_outcomes([wire.retry(0, "E", 1.0)])
    doc_ids = struct.pack("<qq", 0, 1)
    bad = good.replace(struct.pack("<q", 0), doc_ids, 1)
    with pytest.raises(BadReply):
        read_outcomes(bad, range(2))


@pytest.mark.parametrize("raw", [b"abc", b"0", b"-1", b"NaN", b"inf", b"1e-300", b"1e9", b"",
                                 b"\xff\xfe"])
def test_a_weight_that_is_no_weight_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="not"):
        parse_weight(raw)


@pytest.mark.parametrize("raw", [b"0.01", b"1", b"2.5", b"1000"])
def test_weights_in_range_are_read(raw: bytes) -> None:
    assert parse_weight(raw) == float(raw)


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf, -math.inf, 1e-300])
@pytest.mark.parametrize("others", [0, 2])
def test_a_weight_that_gives_no_credit_never_makes_pop_spin(weight: float,
                                                              others: int) -> None:
    """Alone in its tier or not, a tenant of weight 0, -1, NaN or inf is served (as 1)."""
    drr: TenantDRR[int] = TenantDRR(4, {"bad": weight})
    for n in range(3):
        drr.push("bad", n, 10)
    for t in range(others):
        drr.push(f"ok{t}", t, 10)
    popped = [drr.pop()[0] for _ in range(3 + others)]
    assert popped.count("bad") == 3 and len(drr) == 0

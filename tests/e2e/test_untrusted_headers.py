"""What a producer writes is data: platform headers out of any sane range, names with line
breaks, delays of centuries. Each is read as absent or refused with a message (pure logic;
the end-to-end case is ``tests/faults/test_poison.py``)."""

from __future__ import annotations

import math
import time

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE
from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.delay_streams.dlq import DeadLetter, iso_ms
from asynctier.delay_streams.handoff import parcel_from_message
from asynctier.delay_streams.ladder import next_hop, plan_hops
from asynctier.platform import names as n
from asynctier.platform.binding import Binding, is_binding_name
from asynctier.platform.binding_features import Source
from asynctier.platform.errors import BindingError, Retry
from asynctier.scheduler.outcomes import of_exception

NOW = 1_764_000_000_000
DEFAULT = (30.0, 60.0, 300.0, 1800.0)


#: The Kafka timestamp of the records here: a record's time before any platform header.
STAMP = NOW - 90_000


class _Msg:
    def __init__(self, headers: list[tuple[str, bytes | None]],
                 stamp: tuple[int, int] = (TIMESTAMP_CREATE_TIME, STAMP)) -> None:
        self._headers = headers
        self._stamp = stamp

    def timestamp(self) -> tuple[int, int]:
        return self._stamp

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 41

    def value(self) -> bytes:
        return b"{}"

    def key(self) -> None:
        return None

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers


def test_sane_platform_headers_are_read() -> None:
    parcel = parcel_from_message(_Msg([
        (n.H_ATTEMPT, b"3"), (n.H_FIRST_SEEN, b"1000"), (n.H_DUE, str(NOW + 60_000).encode()),
        (n.H_ORIGIN, b"orders/1/9"), (n.H_ERROR, b"RuntimeError: boom"), ("trace", b"t")]), NOW)
    assert (parcel.attempt, parcel.first_seen_ms, parcel.due_ms, parcel.origin) == (
        3, 1000, NOW + 60_000, "orders/1/9")
    assert parcel.headers == [("trace", b"t")] and parcel.error == "RuntimeError: boom"


@pytest.mark.parametrize(("header", "value"), [
    (n.H_ATTEMPT, b"99999999999"), (n.H_ATTEMPT, b"0"), (n.H_ATTEMPT, b"-4"),
    (n.H_ATTEMPT, b"3.5"), (n.H_FIRST_SEEN, b"9" * 25), (n.H_FIRST_SEEN, b"-1"),
    (n.H_FIRST_SEEN, str(NOW + 2 * 86_400_000).encode()),
    (n.H_DUE, b"1700000000000000"), (n.H_DUE, b"-3"), (n.H_ORIGIN, b"x/0/1\nforged"),
    (n.H_ORIGIN, b"o" * 5000), (n.H_ATTEMPT, "²".encode()),
])
def test_a_platform_header_out_of_range_is_read_as_absent(header: str, value: bytes) -> None:
    parcel = parcel_from_message(_Msg([(header, value)]), NOW)
    assert (parcel.attempt, parcel.first_seen_ms, parcel.due_ms, parcel.origin) == (
        1, STAMP, 0, "orders/2/41")


@pytest.mark.parametrize(("stamp", "seen"), [
    ((TIMESTAMP_CREATE_TIME, STAMP), STAMP),  # its deadline counts from it on every attempt
    ((TIMESTAMP_NOT_AVAILABLE, -1), NOW),
    ((TIMESTAMP_CREATE_TIME, NOW + 2 * 86_400_000), NOW),  # a producer's clock gone wrong
    ((TIMESTAMP_CREATE_TIME, 0), NOW),
])
def test_a_record_first_handed_off_keeps_its_kafka_timestamp(stamp: tuple[int, int],
                                                              seen: int) -> None:
    """A record's deadline (``--start-within``) counts from its Kafka timestamp on the main
    path; its retries carry that time as first-seen, not the time of their first hand-off
    (a binding read with a lag would start its retried records that much later)."""
    assert parcel_from_message(_Msg([], stamp), NOW).first_seen_ms == seen


@settings(max_examples=300, deadline=None)
@given(multiple=st.floats(min_value=0.0, max_value=40.0, allow_nan=False),
       ladder=st.lists(st.integers(1, 3600), min_size=1, max_size=6, unique=True))
def test_the_first_hop_is_the_plans_first(multiple: float, ladder: list[int]) -> None:
    steps = [float(s) for s in ladder]
    remaining = multiple * max(steps)
    hops = plan_hops(remaining, steps)
    assert next_hop(remaining, steps) == (hops[0] if hops else None)


def test_the_first_hop_of_a_wait_of_centuries_is_found_at_once() -> None:
    started = time.monotonic()
    assert next_hop(1.7e15, DEFAULT) == 1800.0  # planned hop by hop, this ran out of memory
    assert next_hop(1.7e15, (1.0, 2.0)) == 2.0
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("after", [-1.0, math.inf, math.nan, 366 * 86400.0])
def test_retry_refuses_a_delay_out_of_range(after: float) -> None:
    with pytest.raises(ValueError, match="the delay must be from 0 to"):
        Retry(after=after)


def test_a_retry_delay_set_out_of_range_afterwards_follows_the_ladder() -> None:
    exc = Retry(after=5)
    exc.after = math.inf
    outcome = of_exception(7, exc)
    assert outcome["status"] == "retry" and outcome["after_s"] is None
    assert "out of range" in (outcome["error"] or "")
    assert of_exception(7, Retry(after=365 * 86400.0))["after_s"] == 365 * 86400.0


def test_dead_letter_numbers_that_are_not_numbers_read_as_zero() -> None:
    letter = DeadLetter(0, NOW, None, None, [(n.H_ATTEMPTS_MADE, "²".encode()),
                                              (n.H_FIRST_SEEN, b"9" * 40)])
    assert (letter.attempts, letter.first_seen_ms) == (0, 0)
    assert letter.summary()["first_seen"] == ""
    assert iso_ms(10**30) == ""  # no calendar shows it: nothing, not a crash
    assert iso_ms(NOW) == "2025-11-24T16:00:00.000Z"


@pytest.mark.parametrize("field", ["name", "topic", "function", "tenant"])
def test_a_trailing_line_break_is_refused_in_a_binding(field: str) -> None:
    good = {"name": "orders", "topic": "orders", "function": "myapp.jobs:run",
            "tenant": "media"}

    def made(d: dict[str, str]) -> Binding:
        return Binding(d["name"], Source("kafka", d["topic"]), d["function"], tenant=d["tenant"])

    made(good).validate()
    with pytest.raises(BindingError, match=field):
        made({**good, field: good[field] + "\n"}).validate()


def test_binding_names() -> None:
    assert is_binding_name("orders-2")
    for bad in ("", "no such/binding", "Orders", "orders\n", "x" * 64, "_unbound"):
        assert not is_binding_name(bad), bad

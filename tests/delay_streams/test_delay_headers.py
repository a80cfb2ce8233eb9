"""A delay record's platform headers: packed in one (``asynctier.delay``) or each on its
own, both read the same way; a header written twice (a producer that copied headers, or
one written by hand) is read from its last copy by the delay tailer's release time and
the record it hands on alike; a packed value of another format is read as absent."""

from __future__ import annotations

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from asynctier.delay_streams.handoff import _MAX_AHEAD_MS as MAX_AHEAD_MS
from asynctier.delay_streams.handoff import (
    pack_delay,
    parcel_from_message,
    platform_header,
    unpack_delay,
)
from asynctier.platform import names as n
from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError
from asynctier.tailers.delay import _due_ms

NOW_MS = 1_796_000_000_000


def _msg(headers: list[tuple[str, bytes]]) -> Message:
    return Message(topic="asynctier.delay.30s", partition=0, offset=7, key=None,
                   value=b"{}", headers=headers, timestamp=(2, NOW_MS))


@given(st.lists(st.integers(NOW_MS - 60_000, NOW_MS + 3_600_000), min_size=1, max_size=4),
       st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3),
       st.lists(st.booleans(), min_size=7, max_size=7))
def test_the_last_copy_of_a_header_is_the_one_read(dues: list[int], names: list[str],
                                                   packed: list[bool]) -> None:
    """Each copy written on its own or packed (with the others' values), in any mix."""
    headers = []
    for i, due in enumerate(dues):
        headers.append((n.H_DELAY, pack_delay("x", 2, due, "t/0/1", NOW_MS, "e")) if packed[i]
                       else (n.H_DUE, str(due).encode()))
    for i, name in enumerate(names):
        headers.append((n.H_BINDING, name.encode()) if not packed[4 + i] else
                       (n.H_DELAY, pack_delay(name, 2, dues[-1], "t/0/1", NOW_MS, "e")))
    msg = _msg(headers)
    assert _due_ms(msg) == dues[-1] == parcel_from_message(msg, NOW_MS).due_ms
    assert platform_header(msg, n.H_BINDING) == names[-1].encode()


def test_a_header_not_there_reads_as_none() -> None:
    assert platform_header(_msg([(n.H_ORIGIN, b"t/0/1")]), n.H_DUE) is None
    assert _due_ms(_msg([])) == 0


@given(st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True), st.integers(1, 1000),
       st.integers(0, NOW_MS * 2), st.from_regex(r"[a-z.]{1,20}/[0-9]{1,3}/[0-9]{1,9}",
                                                 fullmatch=True),
       st.integers(0, NOW_MS), st.text(max_size=50))
def test_a_packed_delay_record_reads_as_its_six_headers(
        binding: str, attempt: int, due: int, origin: str, seen: int, error: str) -> None:
    """What the hand-off packs, a parcel reads back whole (the error may hold line breaks
    and any character: it is last)."""
    msg = _msg([("trace", b"t"), (n.H_DELAY, pack_delay(binding, attempt, due, origin, seen,
                                                        error))])
    parcel = parcel_from_message(msg, NOW_MS)
    assert (parcel.attempt, parcel.origin, parcel.first_seen_ms) == (attempt, origin, seen)
    assert parcel.due_ms == (due if due <= NOW_MS + MAX_AHEAD_MS else 0)
    assert parcel.error == error.encode("utf-8", "replace").decode("utf-8", "replace")
    assert parcel.headers == [("trace", b"t")]  # the packed header is the platform's
    assert platform_header(msg, n.H_BINDING) == binding.encode()


@given(st.binary(max_size=60))
def test_a_packed_value_of_another_format_is_read_as_absent(value: bytes) -> None:
    """Records are data: a value that is not format 1 with seven fields names nothing, and
    the record reads as one without platform headers (its origin is where it sits)."""
    fields = unpack_delay(value)
    if not (value.startswith(b"1\n") and value.count(b"\n") >= 6):
        assert fields == {}
    parcel = parcel_from_message(_msg([(n.H_DELAY, b"2\nb\n3\n0\nt/0/1\n0\ne")]), NOW_MS)
    assert (parcel.attempt, parcel.origin) == (1, "asynctier.delay.30s/0/7")


def test_delay_headers_setting_is_packed_or_separate() -> None:
    assert Settings().delay_headers == "packed"
    config = Settings.from_mapping({"asynctier": {"delay_headers": "separate"}})
    assert config.delay_headers == "separate"
    with pytest.raises(ConfigError, match=r"delay_headers = 'both'.*separate"):
        Settings.from_mapping({"asynctier": {"delay_headers": "both"}})

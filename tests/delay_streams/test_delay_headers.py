"""A record with a platform header written twice (a producer that copied headers, or one
written by hand): the delay tailer's release time and the record it hands on follow the
same copy, the last, as every other reader of platform headers does."""

from __future__ import annotations

from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from asynctier.delay_streams.handoff import parcel_from_message
from asynctier.platform import names as n
from asynctier.tailers.delay import _due_ms, _header

NOW_MS = 1_796_000_000_000


def _msg(headers: list[tuple[str, bytes]]) -> Message:
    return Message(topic="asynctier.delay.30s", partition=0, offset=7, key=None,
                   value=b"{}", headers=headers, timestamp=(2, NOW_MS))


@given(st.lists(st.integers(NOW_MS - 60_000, NOW_MS + 3_600_000), min_size=1, max_size=4),
       st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3))
def test_the_last_copy_of_a_header_is_the_one_read(dues: list[int], names: list[str]) -> None:
    headers = [(n.H_DUE, str(d).encode()) for d in dues]
    headers += [(n.H_BINDING, b) for b in (x.encode() for x in names)]
    msg = _msg(headers)
    assert _due_ms(msg) == dues[-1] == parcel_from_message(msg, NOW_MS).due_ms
    assert _header(msg, n.H_BINDING) == names[-1].encode()


def test_a_header_not_there_reads_as_none() -> None:
    assert _header(_msg([(n.H_ORIGIN, b"t/0/1")]), n.H_DUE) is None
    assert _due_ms(_msg([])) == 0

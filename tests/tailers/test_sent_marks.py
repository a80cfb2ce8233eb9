"""The sent marks on the real Redis: which records a tailer may send as fresh (no copy of
them sent before, docs/design.md, Run once off the path), and which it must not."""

from __future__ import annotations

import logging

import pytest
import redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Limits, Source
from asynctier.platform.config import Settings
from asynctier.tailers.sent_marks import LEAP, SentMarks

BINDING = Binding("orders", Source("kafka", "orders"), "tests.funcs.basic:record")
TP = ("orders", 3)


def _end(offset: int):  # type: ignore[no-untyped-def]
    return lambda tp: offset


def test_a_partition_without_a_mark_takes_the_logs_end_and_raises_in_leaps(
        settings: Settings, redis_client: redis.Redis) -> None:
    marks = SentMarks(settings, BINDING)
    marks.take([TP], _end(500))  # 500 records there already: they may have been sent
    assert marks.fresh_start(TP, 499) is None  # all below the mark: none fresh
    assert marks.fresh_start(TP, 700) == 500  # 500..700 fresh, the mark raised first
    assert int(redis_client.hget(marks.key(TP), "mark")) == 701 + LEAP
    assert marks.fresh_start(TP, 800) == 500  # inside the leap: no write
    # the next owner (a restart, a rebalance) takes the mark: all that is below is guarded
    later = SentMarks(settings, BINDING)
    later.take([TP], _end(0))
    assert later.fresh_start(TP, 701 + LEAP - 1) is None
    assert later.fresh_start(TP, 701 + LEAP) == 701 + LEAP


def test_a_binding_fresh_from_its_start_sends_a_partition_without_a_mark_fresh(
        settings: Settings, redis_client: redis.Redis) -> None:
    """Bound by a release with marks, no tailer sent from a partition without raising its
    mark first: one without was never sent from, its backlog is fresh; once raised, the
    next owner guards what is below, and a mark that does not read is the log's end."""
    bound = BINDING.with_changes(fresh_from_start=True)
    marks = SentMarks(settings, bound)
    marks.take([TP], _end(500))
    assert marks.fresh_start(TP, 499) == 0
    later = SentMarks(settings, bound)
    later.take([TP], _end(0))
    assert later.fresh_start(TP, 499) is None
    redis_client.hset(marks.key(TP), "mark", b"abc")
    broken = SentMarks(settings, bound)
    broken.take([TP], _end(600))
    assert broken.fresh_start(TP, 599) is None and broken.fresh_start(TP, 600) == 600


def test_a_tailer_whose_mark_was_taken_sends_nothing_fresh(
        settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """One that lost its partition without knowing, still sending: its raise is refused,
    and what it sends is claimed before it runs."""
    old, new = SentMarks(settings, BINDING), SentMarks(settings, BINDING)
    old.take([TP], _end(0))
    assert old.fresh_start(TP, 10) == 0
    new.take([TP], _end(0))
    with caplog.at_level(logging.WARNING):
        assert old.fresh_start(TP, 20 + LEAP) is None
    assert "another tailer took the sent mark of orders/3" in caplog.text
    assert old.fresh_start(TP, 30) is None  # forgotten until assigned again
    assert new.fresh_start(TP, 11 + LEAP) == 11 + LEAP


@pytest.mark.parametrize("value", [b"abc", b"-5", b"1.5", b"1e400"])
def test_a_mark_that_is_not_an_offset_reads_as_none(
        settings: Settings, redis_client: redis.Redis, value: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    marks = SentMarks(settings, BINDING)
    redis_client.hset(marks.key(TP), "mark", value)
    with caplog.at_level(logging.WARNING):
        marks.take([TP], _end(40))
    assert "is not an offset" in caplog.text
    assert marks.fresh_start(TP, 39) is None and marks.fresh_start(TP, 40) == 40
    assert int(redis_client.hget(marks.key(TP), "mark")) == 41 + LEAP  # written anew


def test_without_redis_nothing_is_fresh(settings: Settings,
                                        caplog: pytest.LogCaptureFixture) -> None:
    marks = SentMarks(settings, BINDING,
                      redis.Redis.from_url("redis://127.0.0.1:1/0", socket_timeout=1))
    with caplog.at_level(logging.WARNING):
        marks.take([TP], _end(0))
    assert marks.fresh_start(TP, 5) is None
    assert "could not take the sent mark of orders/3" in caplog.text


def test_only_a_guarded_fail_open_binding_has_marks(settings: Settings) -> None:
    assert SentMarks.for_binding(settings, BINDING) is not None
    idempotent = Binding("i", Source("kafka", "t"), "m:f", execution=Execution(idempotent=True))
    closed = Binding("c", Source("kafka", "t"), "m:f", limits=Limits(redis_policy="fail_closed"))
    assert SentMarks.for_binding(settings, idempotent) is None
    assert SentMarks.for_binding(settings, closed) is None

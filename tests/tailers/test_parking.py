"""The parked keys of a ``--ordering key`` binding (``tailers/parking.py``) on a real Redis:
a key's records wait behind its head and run in order, and every script touches only the
keys it is given in ``KEYS`` (issue #29), refusing a wait list the caller did not name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from asynctier.platform.config import Settings
from asynctier.platform.redis_client import sync_client
from asynctier.tailers.parking import FREE, HEAD, HELD, ParkingLot, Waiting


@pytest.fixture
def lot(settings: Settings, redis_client: redis.Redis) -> Iterator[ParkingLot]:
    """A binding's parked keys on the session's Redis (keys deleted by redis_client)."""
    got = ParkingLot(sync_client(settings.redis_url), settings.prefix, "parkt")
    yield got
    got.redis.close()


def record(offset: int, key: bytes = b"a") -> Waiting:
    """A waiting record of ``orders/0/<offset>``."""
    return Waiting(f"orders/0/{offset}", key, b"v%d" % offset, [("h", b"x")], 1000 + offset)


def test_a_key_waits_behind_its_head_and_its_records_run_in_order(lot: ParkingLot) -> None:
    lot.park([("ka", "orders/0/1")])
    assert lot.check([("ka", "orders/0/1"), ("ka", "orders/0/2"), ("kb", "orders/0/3")]) == [
        HEAD, HELD, FREE]
    lot.push([("ka", record(2)), ("ka", record(4))])
    assert lot.take(10) == []  # its head is still on the delay path
    assert lot.waiting_origins("ka") == (2, ["orders/0/2", "orders/0/4"])
    lot.unpark([("ka", "orders/0/9")])  # not its head: nothing moves
    assert lot.take(10) == []
    lot.unpark([("ka", "orders/0/1")])
    [(okey, blob)] = lot.take(10)
    assert (okey, Waiting.decode(blob)) == ("ka", record(2))
    lot.done([("ka", blob, False, "orders/0/2")])
    [(okey, blob)] = lot.take(10)
    assert Waiting.decode(blob).origin == "orders/0/4"
    lot.done([("ka", blob, False, "orders/0/4")])
    assert lot.take(10) == []
    assert lot.check([("ka", "orders/0/5")]) == [FREE]
    assert lot.stats().keys == 0


def test_take_skips_a_key_that_is_no_longer_ready(lot: ParkingLot) -> None:
    lot.push([("ka", record(1))])  # no head: ready at once
    lot.redis.sadd(lot.ready, "kc")  # ready, but its list is empty: dropped from ready
    got = lot._take(keys=[lot.ready, *(lot.wait_key(k) for k in ("kb", "ka", "kc"))],
                    args=[lot.wait, "kb", "ka", "kc"])  # kb: picked, then taken by another
    assert [x.decode() for x in got[::2]] == ["ka"]
    assert lot.redis.smembers(lot.ready) == {b"ka"}


def test_each_script_refuses_a_wait_list_it_was_not_given(lot: ParkingLot) -> None:
    fixed = [lot.head, lot.parked, lot.ready]
    blob = record(1).encode()
    calls = {  # each in a state where the script reaches ka's wait list
        "check": lambda keys: lot._check(keys=keys, args=[lot.wait, "ka", "orders/0/1"]),
        "push": lambda keys: lot._push(keys=keys, args=[lot.wait, 1, "ka", blob]),
        "take": lambda keys: lot._take(keys=keys[2:], args=[lot.wait, "ka"]),  # ready first
        "done": lambda keys: lot._done(keys=keys, args=[lot.wait, 1, "ka", blob, "0", ""]),
    }
    for name, call in calls.items():
        if name == "take":
            lot.redis.sadd(lot.ready, "ka")
        with pytest.raises(redis.ResponseError, match="is not in KEYS"):
            call([*fixed, lot.wait_key("kb")])
    lot.park([("ka", "orders/0/1")])
    with pytest.raises(redis.ResponseError, match="is not in KEYS"):
        lot._unpark(keys=fixed, args=[lot.wait, "ka", "orders/0/1"])
    assert lot.redis.exists(lot.wait_key("ka")) == 0  # refused before any write to it

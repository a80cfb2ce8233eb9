"""Parked keys of a ``--ordering key`` binding, in Redis (docs/design.md, Per-key order).

A key is *parked* while one of its records is on the delay path (its *head*) or while
records of it wait behind one. Per binding, under ``<prefix>:{order:<binding>}:``:

- ``head``: hash, order key (hex) -> the origin (``topic/partition/offset``) of the record
  on the delay path;
- ``w:<hex>``: list, the key's waiting records in offset order (JSON, bytes in base64);
- ``ready``: set, keys whose head is resolved and which still have waiting records: the
  parked-key runner runs their first waiting record;
- ``parked``: sorted set, every parked key scored by the time (ms) it was parked.

Every change is one Lua script, so a key's state moves atomically between tailers, delay
tailers and runners.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError
from asynctier.platform.redis_client import SyncRedis, sync_client

#: Codes of :meth:`ParkingLot.check`: run it, it waits behind its key, it is the key's head.
RUN, HELD, HEAD = 0, 1, 2

_CHECK = """
local out = {}
for i = 2, #ARGV, 2 do
  local head = redis.call('HGET', KEYS[1], ARGV[i])
  if head == ARGV[i + 1] then out[#out + 1] = 2
  elseif head or redis.call('EXISTS', ARGV[1] .. ARGV[i]) == 1 then out[#out + 1] = 1
  else out[#out + 1] = 0 end
end
return out
"""
_PUSH = """
for i = 3, #ARGV, 2 do
  local k = ARGV[i]
  redis.call('RPUSH', ARGV[1] .. k, ARGV[i + 1])
  redis.call('ZADD', KEYS[2], 'NX', ARGV[2], k)
  if redis.call('HEXISTS', KEYS[1], k) == 0 then redis.call('SADD', KEYS[3], k) end
end
return 1
"""
_PARK = """
for i = 2, #ARGV, 2 do
  local k = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], k) == 0 then redis.call('HSET', KEYS[1], k, ARGV[i + 1]) end
  redis.call('ZADD', KEYS[2], 'NX', ARGV[1], k)
  redis.call('SREM', KEYS[3], k)
end
return 1
"""
_UNPARK = """
for i = 2, #ARGV, 2 do
  local k = ARGV[i]
  if redis.call('HGET', KEYS[1], k) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], k)
    if redis.call('EXISTS', ARGV[1] .. k) == 1 then redis.call('SADD', KEYS[3], k)
    else redis.call('ZREM', KEYS[2], k) end
  end
end
return 1
"""
_TAKE = """
local keys = redis.call('SRANDMEMBER', KEYS[1], ARGV[2])
local out = {}
for _, k in ipairs(keys) do
  local first = redis.call('LINDEX', ARGV[1] .. k, 0)
  if first then out[#out + 1] = k; out[#out + 1] = first
  else redis.call('SREM', KEYS[1], k) end
end
return out
"""
_DONE = """
for i = 3, #ARGV, 4 do
  local k, blob, park, origin = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local list = ARGV[1] .. k
  if redis.call('LINDEX', list, 0) == blob then redis.call('LPOP', list) end
  if park == '1' and redis.call('HEXISTS', KEYS[1], k) == 0 then
    redis.call('HSET', KEYS[1], k, origin)
  end
  if redis.call('HEXISTS', KEYS[1], k) == 1 then redis.call('SREM', KEYS[3], k)
  elseif redis.call('EXISTS', list) == 0 then
    redis.call('SREM', KEYS[3], k); redis.call('ZREM', KEYS[2], k)
  end
end
return 1
"""


def order_key(key: bytes | None, origin: str) -> str:
    """The key records are ordered by: the record's key, or (none) its first partition."""
    if key is not None:
        return "k" + key.hex()
    parts = origin.rsplit("/", 2)
    return "p" + (parts[-2] if len(parts) == 3 else "")


@dataclass(slots=True)
class Waiting:
    """A record waiting behind its key: what it needs to run and be handed off."""

    origin: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    record_time_ms: int

    def encode(self) -> str:
        """JSON, bytes in base64 (records are data: never pickled)."""
        return json.dumps({"o": self.origin, "k": _b64(self.key), "v": _b64(self.value),
                           "h": [[name, _b64(value)] for name, value in self.headers],
                           "t": self.record_time_ms}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Waiting:
        """The record :meth:`encode` wrote."""
        doc = json.loads(text)
        return cls(doc["o"], _unb64(doc["k"]), _unb64(doc["v"]),
                   [(str(name), _unb64(value)) for name, value in doc["h"]], int(doc["t"]))


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@dataclass(frozen=True)
class ParkedStats:
    """How many keys of a binding are parked, and since when the oldest (0: none)."""

    keys: int
    waiting_heads: int
    oldest_age_s: float


class ParkingLot:
    """One binding's parked keys. Redis errors are raised as HandoffError: the pipeline
    then tries the hand-off again and checkpoints nothing meanwhile."""

    def __init__(self, redis: SyncRedis, prefix: str, binding: str) -> None:
        self.redis = redis
        base = f"{prefix}:{{order:{binding}}}:"  # one hash tag: one slot on a Redis Cluster
        self.head, self.ready, self.parked, self.wait = (
            base + "head", base + "ready", base + "parked", base + "w:")
        self._check = redis.register_script(_CHECK)
        self._push = redis.register_script(_PUSH)
        self._park = redis.register_script(_PARK)
        self._unpark = redis.register_script(_UNPARK)
        self._take = redis.register_script(_TAKE)
        self._done = redis.register_script(_DONE)

    @classmethod
    def of(cls, settings: Settings, binding: str) -> ParkingLot:
        """The parked keys of ``binding`` on the settings' Redis."""
        redis = sync_client(settings.redis_url, socket_timeout=10.0,
                            socket_connect_timeout=5.0)
        return cls(redis, settings.prefix, binding)

    def _run(self, script: Any, keys: list[str], args: list[Any], what: str) -> Any:
        try:
            return script(keys=keys, args=args)
        except RedisError as exc:
            raise HandoffError(f"parked keys in Redis: {what} failed ({exc}); check that "
                               "Redis answers") from exc

    def check(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """For each (order key, origin): RUN, HELD (its key is parked) or HEAD (it is the
        key's record on the delay path, read again)."""
        if not pairs:
            return []
        args: list[Any] = [self.wait]
        for okey, origin in pairs:
            args += (okey, origin)
        return [int(c) for c in self._run(self._check, [self.head], args, "checking keys")]

    def push(self, waiting: Sequence[tuple[str, Waiting]]) -> None:
        """Append records behind their keys (a key without a head becomes ready)."""
        if not waiting:
            return
        args: list[Any] = [self.wait, _now_ms()]
        for okey, record in waiting:
            args += (okey, record.encode())
        self._run(self._push, [self.head, self.parked, self.ready], args, "parking records")

    def park(self, heads: Sequence[tuple[str, str]]) -> None:
        """(order key, origin): that record went to the delay path; its key waits for it."""
        if heads:
            args: list[Any] = [_now_ms()]
            for okey, origin in heads:
                args += (okey, origin)
            self._run(self._park, [self.head, self.parked, self.ready], args, "parking keys")

    def unpark(self, heads: Sequence[tuple[str, str]]) -> None:
        """(order key, origin): that head succeeded or is a dead letter; its key's waiting
        records may run (nothing when it is not the key's head)."""
        if heads:
            args: list[Any] = [self.wait]
            for okey, origin in heads:
                args += (okey, origin)
            self._run(self._unpark, [self.head, self.parked, self.ready], args,
                      "unparking keys")

    def take(self, count: int) -> list[tuple[str, str]]:
        """Up to ``count`` ready keys with their first waiting record (encoded)."""
        got = self._run(self._take, [self.ready], [self.wait, count], "taking ready keys")
        pairs = [x.decode() if isinstance(x, bytes) else str(x) for x in got]
        return list(zip(pairs[::2], pairs[1::2], strict=True))

    def done(self, results: Sequence[tuple[str, str, bool, str]]) -> None:
        """(order key, encoded record, parked, origin): a waiting record ran; it leaves
        its list, and its key is parked again behind it (``parked``) or moves on."""
        if results:
            args: list[Any] = [self.wait, _now_ms()]
            for okey, blob, parked, origin in results:
                args += (okey, blob, "1" if parked else "0", origin)
            self._run(self._done, [self.head, self.parked, self.ready], args,
                      "finishing waiting records")

    def waiting_origins(self, okey: str, limit: int = 20) -> tuple[int, list[str]]:
        """How many records wait behind ``okey``, and the origins of the first ``limit``."""
        try:
            pipe = self.redis.pipeline()
            pipe.llen(self.wait + okey)
            pipe.lrange(self.wait + okey, 0, limit - 1)
            count, first = pipe.execute()
        except RedisError as exc:
            raise HandoffError(f"parked keys in Redis: reading waiting records failed "
                               f"({exc})") from exc
        return int(count), [Waiting.decode(blob).origin for blob in first]

    def stats(self) -> ParkedStats:
        """Parked keys, heads on the delay path, and the oldest parked key's age."""
        pipe = self.redis.pipeline()
        pipe.zcard(self.parked)
        pipe.hlen(self.head)
        pipe.zrange(self.parked, 0, 0, withscores=True)
        count, heads, oldest = pipe.execute()
        age = max(0.0, time.time() - oldest[0][1] / 1000) if oldest else 0.0
        return ParkedStats(int(count), int(heads), age)


def _now_ms() -> int:
    return int(time.time() * 1000)

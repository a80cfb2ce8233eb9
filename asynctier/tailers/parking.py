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
tailers and runners. A script touches only the keys it is given in ``KEYS`` (the caller
names the wait lists of the records it passes, :meth:`ParkingLot.wait_key`) and refuses
any other; taking ready keys picks them first (``SRANDMEMBER``), then runs the script on
their lists.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from asynctier.platform.config import Settings
from asynctier.platform.durations import epoch_ms
from asynctier.platform.errors import HandoffError
from asynctier.platform.redis_client import SyncRedis, sync_client

#: Codes of :meth:`ParkingLot.check`: its key is free, it waits behind its key, it is the
#: key's head.
FREE, HELD, HEAD = 0, 1, 2
#: A Redis call that takes longer fails (a HandoffError: the pipeline tries again), and
#: so does a connection not made in the second figure: Redis down must not hang a tailer.
REDIS_TIMEOUT_S = 10.0
REDIS_CONNECT_S = 5.0
#: How many waiting records a dead letter's ``asynctier.ran-after`` header names.
RAN_AFTER_NAMED = 20

# Every script starts with this: each name it builds passes through key(), which refuses
# (an error reply) a name not in KEYS, as Redis requires of scripts (Redis Cluster routes
# a call by its KEYS). The caller names the wait lists of the records it passes
# (ParkingLot.wait_key); Python and Lua disagreeing on a name fails loudly.
_KEY_LIB = """
local declared = {}
for i = 1, #KEYS do declared[KEYS[i]] = true end
local function key(name)
  if not declared[name] then
    error(redis.error_reply('ERR parked keys: key ' .. name .. ' is not in KEYS '
                            .. '(parking.py and its scripts disagree on key names)'))
  end
  return name
end
"""
_CHECK = _KEY_LIB + """
local out = {}
for i = 2, #ARGV, 2 do
  local head = redis.call('HGET', KEYS[1], ARGV[i])
  if head == ARGV[i + 1] then out[#out + 1] = 2
  elseif head or redis.call('EXISTS', key(ARGV[1] .. ARGV[i])) == 1 then out[#out + 1] = 1
  else out[#out + 1] = 0 end
end
return out
"""
_VIEW = """
if redis.call('ZCARD', KEYS[2]) > tonumber(ARGV[1]) then return false end
local out = {}
for _, k in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  out[#out + 1] = k
  out[#out + 1] = redis.call('HGET', KEYS[1], k) or ''
end
return out
"""
_PUSH = _KEY_LIB + """
for i = 3, #ARGV, 2 do
  local k = ARGV[i]
  redis.call('RPUSH', key(ARGV[1] .. k), ARGV[i + 1])
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
_UNPARK = _KEY_LIB + """
for i = 2, #ARGV, 2 do
  local k = ARGV[i]
  if redis.call('HGET', KEYS[1], k) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], k)
    if redis.call('EXISTS', key(ARGV[1] .. k)) == 1 then redis.call('SADD', KEYS[3], k)
    else redis.call('ZREM', KEYS[2], k) end
  end
end
return 1
"""
# The ready keys are picked by the client (SRANDMEMBER) so that this script is given
# their wait lists as KEYS; a key no longer ready meanwhile is skipped.
_TAKE = _KEY_LIB + """
local out = {}
for i = 2, #ARGV do
  local k = ARGV[i]
  if redis.call('SISMEMBER', KEYS[1], k) == 1 then
    local first = redis.call('LINDEX', key(ARGV[1] .. k), 0)
    if first then out[#out + 1] = k; out[#out + 1] = first
    else redis.call('SREM', KEYS[1], k) end
  end
end
return out
"""
_DONE = _KEY_LIB + """
for i = 3, #ARGV, 4 do
  local k, blob, park, origin = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local list = key(ARGV[1] .. k)
  if redis.call('LINDEX', list, 0) == blob then redis.call('LPOP', list) end
  if park == '1' and redis.call('HEXISTS', KEYS[1], k) == 0 then
    redis.call('HSET', KEYS[1], k, origin)
    redis.call('ZADD', KEYS[2], 'NX', ARGV[2], k)
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
        self._view = redis.register_script(_VIEW)
        self._push = redis.register_script(_PUSH)
        self._park = redis.register_script(_PARK)
        self._unpark = redis.register_script(_UNPARK)
        self._take = redis.register_script(_TAKE)
        self._done = redis.register_script(_DONE)

    def wait_key(self, okey: str) -> str:
        """The list of records waiting behind order key ``okey`` (the scripts build the
        same name and refuse it unless it is in their ``KEYS``)."""
        return self.wait + okey

    def _fixed_and_waits(self, okeys: Iterable[str]) -> list[str]:
        """``KEYS`` of a script: head, parked, ready, then the wait lists of ``okeys``."""
        return [self.head, self.parked, self.ready,
                *dict.fromkeys(self.wait_key(k) for k in okeys)]

    @classmethod
    def of(cls, settings: Settings, binding: str) -> ParkingLot:
        """The parked keys of ``binding`` on the settings' Redis."""
        redis = sync_client(settings.redis_url, socket_timeout=REDIS_TIMEOUT_S,
                            socket_connect_timeout=REDIS_CONNECT_S)
        return cls(redis, settings.prefix, binding)

    def _run(self, script: Any, keys: list[str], args: list[Any], what: str) -> Any:
        try:
            return script(keys=keys, args=args)
        except RedisError as exc:
            raise HandoffError(f"parked keys in Redis: {what} failed ({exc}); check that "
                               "Redis answers") from exc

    def check(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """For each (order key, origin): FREE (its key is not parked: it may run), HELD
        (its key is parked) or HEAD (it is the key's record on the delay path, read
        again)."""
        if not pairs:
            return []
        args: list[Any] = [self.wait]
        for okey, origin in pairs:
            args += (okey, origin)
        keys = [self.head, *dict.fromkeys(self.wait_key(k) for k, _ in pairs)]
        return [int(c) for c in self._run(self._check, keys, args, "checking keys")]

    def parked_view(self, limit: int) -> dict[str, str] | None:
        """Every parked key -> its head's origin ("" when it has none, only records
        waiting); None when more than ``limit`` keys are parked. One O(parked) call: with
        nothing parked, a batch is checked without a word per record."""
        got = self._run(self._view, [self.head, self.parked], [limit], "reading parked keys")
        if got is None:
            return None
        texts = [x.decode() if isinstance(x, bytes) else str(x) for x in got]
        return dict(zip(texts[::2], texts[1::2], strict=True))

    def push(self, waiting: Sequence[tuple[str, Waiting]]) -> None:
        """Append records behind their keys (a key without a head becomes ready)."""
        if not waiting:
            return
        args: list[Any] = [self.wait, epoch_ms()]
        for okey, record in waiting:
            args += (okey, record.encode())
        self._run(self._push, self._fixed_and_waits(k for k, _ in waiting), args,
                  "parking records")

    def park(self, heads: Sequence[tuple[str, str]]) -> None:
        """(order key, origin): that record went to the delay path; its key waits for it."""
        if heads:
            args: list[Any] = [epoch_ms()]
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
            self._run(self._unpark, self._fixed_and_waits(k for k, _ in heads), args,
                      "unparking keys")

    def take(self, count: int) -> list[tuple[str, str]]:
        """Up to ``count`` ready keys with their first waiting record (encoded)."""
        try:
            picked = self.redis.srandmember(self.ready, count)
        except RedisError as exc:
            raise HandoffError(f"parked keys in Redis: picking ready keys failed ({exc}); "
                               "check that Redis answers") from exc
        okeys = [x.decode() if isinstance(x, bytes) else str(x) for x in picked or []]
        if not okeys:
            return []
        keys = [self.ready, *(self.wait_key(k) for k in okeys)]
        got = self._run(self._take, keys, [self.wait, *okeys], "taking ready keys")
        pairs = [x.decode() if isinstance(x, bytes) else str(x) for x in got]
        return list(zip(pairs[::2], pairs[1::2], strict=True))

    def done(self, results: Sequence[tuple[str, str, bool, str]]) -> None:
        """(order key, encoded record, parked, origin): a waiting record ran; it leaves
        its list, and its key is parked again behind it (``parked``) or moves on."""
        if results:
            args: list[Any] = [self.wait, epoch_ms()]
            for okey, blob, parked, origin in results:
                args += (okey, blob, "1" if parked else "0", origin)
            self._run(self._done, self._fixed_and_waits(r[0] for r in results), args,
                      "finishing waiting records")

    def waiting_origins(self, okey: str, limit: int = RAN_AFTER_NAMED) -> tuple[int, list[str]]:
        """How many records wait behind ``okey``, and the origins of the first ``limit``."""
        try:
            pipe = self.redis.pipeline()
            pipe.llen(self.wait_key(okey))
            pipe.lrange(self.wait_key(okey), 0, limit - 1)
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



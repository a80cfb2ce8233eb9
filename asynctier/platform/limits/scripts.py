"""The Lua scripts that keep the shared counters, one module constant each.

Each script takes its time from Redis ``TIME`` (so schedulers' clocks never matter), does
O(1) work per item, and is registered once per :class:`~redis.asyncio.Redis` client
(``register_script``: EVALSHA, loaded again by itself after a Redis restart). Numbers are
written back with ``string.format`` so that no precision is lost to Lua's ``tostring``.
"""

from __future__ import annotations

from typing import Final

#: A token bucket that hands out reservations: the tokens are always taken, the bucket may
#: go into debt, and the caller sleeps for the time the debt takes to refill. One round trip
#: per take, whatever ``n`` (larger than the burst too), and first come, first served.
#:
#: KEYS[1]  the bucket (hash: ``tokens``, ``ts`` in microseconds)
#: ARGV[1]  rate, tokens per second (> 0)
#: ARGV[2]  burst, the bucket's capacity (>= 1)
#: ARGV[3]  n, the tokens to take (>= 1)
#: ARGV[4]  spare (optional, >= 0): up to this many more tokens, taken only from what the
#:          bucket holds after the ``n`` (never into debt), for the caller to use next
#: Returns  {the microseconds to wait before the ``n`` items may start (0: at once),
#:           the spare tokens granted}.
TAKE_TOKENS: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
elseif now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
end
tokens = tokens - n
local spare = 0
local want = tonumber(ARGV[4]) or 0
if want > 0 and tokens >= 1 then
  spare = math.min(want, math.floor(tokens))
  tokens = tokens - spare
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens),
           'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) * 1000 / rate) + 1000)
local wait = 0
if tokens < 0 then
  wait = math.ceil(-tokens * 1000000 / rate)
end
return {wait, spare}
"""

#: Charge a tenant for a chunk of items against its per-minute and per-day quotas. An item
#: whose idempotency key exists was charged before (the same record seen again) and is
#: admitted free; an item that does not fit is returned with the time until the exhausted
#: window resets. Windows are fixed: the minute and the UTC day of Redis ``TIME``.
#:
#: The idempotency keys are ARGV[2] .. source reference. They are built here rather than
#: passed as KEYS because packing one argument per item cost the scheduler more CPU than
#: the rest of admission (a single-instance Redis is assumed, as for every script here).
#:
#: KEYS[1]  the tenant's quota (hash: ``per_minute``, ``per_day``; a missing field is
#:          no limit; no hash at all: nothing is charged and nothing is written)
#: KEYS[2]  the tenant's usage (hash: ``m``, ``mc``, ``d``, ``dc``: window ids and counts)
#: ARGV[1]  seconds an idempotency key lives
#: ARGV[2]  the idempotency keys' prefix
#: ARGV[3]  the chunk's source references, in order, joined by newlines
#: Returns  a flat list: 1 when the tenant has a quota (0: none, and nothing else), then
#:          for each item over quota its position (1-based) in the chunk and the
#:          milliseconds until it may run.
CHARGE_QUOTA: Final = """
local limits = redis.call('HMGET', KEYS[1], 'per_minute', 'per_day')
local per_minute = tonumber(limits[1])
local per_day = tonumber(limits[2])
if per_minute == nil and per_day == nil then
  return {0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local minute = math.floor(now / 60000)
local day = math.floor(now / 86400000)
local used = redis.call('HMGET', KEYS[2], 'm', 'mc', 'd', 'dc')
local mc = 0
local dc = 0
if tonumber(used[1]) == minute then mc = tonumber(used[2]) or 0 end
if tonumber(used[3]) == day then dc = tonumber(used[4]) or 0 end
local ttl = tonumber(ARGV[1])
local prefix = ARGV[2]
local refs = ARGV[3]
local over = {1}
local charged = 0
local position = 0
local start = 1
while start <= #refs + 1 do
  local stop = string.find(refs, '\\n', start, true) or (#refs + 1)
  local key = prefix .. string.sub(refs, start, stop - 1)
  start = stop + 1
  position = position + 1
  local wait = 0
  if per_minute ~= nil and mc >= per_minute then
    wait = (minute + 1) * 60000 - now
  end
  if per_day ~= nil and dc >= per_day then
    wait = math.max(wait, (day + 1) * 86400000 - now)
  end
  if wait == 0 then
    if redis.call('SET', key, '1', 'NX', 'EX', ttl) then
      mc = mc + 1
      dc = dc + 1
      charged = charged + 1
    end
  elseif redis.call('EXISTS', key) == 0 then
    over[#over + 1] = position
    over[#over + 1] = wait
  end
end
if charged > 0 then
  redis.call('HSET', KEYS[2], 'm', string.format('%.0f', minute), 'mc', mc,
             'd', string.format('%.0f', day), 'dc', dc)
  redis.call('EXPIRE', KEYS[2], 172800)
end
return over
"""

#: Take one concurrency lease if fewer than ``cap`` live leases exist. Leases are members
#: of a sorted set scored by their expiry; expired ones (their holder died or stalled) are
#: dropped first, so a dead holder's slots come back within one lease time. The set itself
#: expires with its latest lease.
#:
#: KEYS[1]  the binding's leases (sorted set: lease id -> expiry, epoch ms)
#: ARGV[1]  cap, the most live leases (>= 1)
#: ARGV[2]  the new lease's id
#: ARGV[3]  lease time, ms
#: Returns  1 when the lease was taken, 0 when the cap is reached.
ACQUIRE_LEASE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1
"""

#: Extend the leases a holder still has (the heartbeat). A lease that is gone was lost (its
#: holder stalled past the lease time and another took the slot) and is not brought back.
#:
#: KEYS[1]   the binding's leases (sorted set: lease id -> expiry, epoch ms)
#: ARGV[1]   lease time, ms
#: ARGV[2..] the lease ids the caller holds
#: Returns   the lease ids that were gone.
RENEW_LEASES: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = string.format('%.0f', now + tonumber(ARGV[1]))
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], last[2])
end
return lost
"""

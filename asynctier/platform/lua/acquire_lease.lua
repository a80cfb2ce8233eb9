-- Take one concurrency lease if fewer than cap live leases exist. Leases are members of a
-- sorted set scored by their expiry; expired ones (their holder died or stalled) are
-- dropped first, so a dead holder's slots come back within one lease time. The set itself
-- expires with its latest lease.
--
-- KEYS[1]  the binding's leases (sorted set: lease id -> expiry, epoch ms)
-- ARGV[1]  cap, the most live leases (>= 1)
-- ARGV[2]  the new lease's id
-- ARGV[3]  lease time, ms
-- Returns  {1 when the lease was taken, 0 when the cap is reached, the leases refused
--           ("<id>=<expiry>", one a line; '' for none)}.
--
-- A lease whose expiry is more than AHEAD times the lease time ahead (anything may write
-- to Redis; a holder's heartbeat never sets one that far) would hold its slot for ever:
-- it is refused, dropped like an expired one, and named in the answer.
local AHEAD = 10
local now = redis_now_ms()
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local refused = {}
local far = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.0f', now + AHEAD * ttl),
                       '+inf', 'WITHSCORES')
for i = 1, #far, 2 do
  refused[#refused + 1] = string.sub(far[i], 1, 40) .. '=' .. far[i + 1]
  redis.call('ZREM', KEYS[1], far[i])
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return {0, table.concat(refused, '\n')}
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return {1, table.concat(refused, '\n')}

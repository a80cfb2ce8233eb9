-- Take one concurrency lease if fewer than cap live leases exist. Leases are members of a
-- sorted set scored by their expiry; expired ones (their holder died or stalled) are
-- dropped first, so a dead holder's slots come back within one lease time. The set itself
-- expires with its latest lease.
--
-- KEYS[1]  the binding's leases (sorted set: lease id -> expiry, epoch ms)
-- ARGV[1]  cap, the most live leases (>= 1)
-- ARGV[2]  the new lease's id
-- ARGV[3]  lease time, ms
-- Returns  1 when the lease was taken, 0 when the cap is reached.
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

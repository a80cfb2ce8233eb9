-- Extend the leases a holder still has (the heartbeat). A lease that is gone was lost (its
-- holder stalled past the lease time and another took the slot) and is not brought back.
--
-- KEYS[1]   the binding's leases (sorted set: lease id -> expiry, epoch ms)
-- ARGV[1]   lease time, ms
-- ARGV[2..] the lease ids the caller holds
-- Returns   the lease ids that were gone.
local now = redis_now_ms()
local expiry = string.format('%.0f', now + tonumber(ARGV[1]))
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
-- The set expires with its latest lease; a lease further ahead than AHEAD lease times
-- (which acquire_lease.lua refuses and drops) does not push that out.
local AHEAD = 10
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  local until_ms = math.min(tonumber(last[2]), now + AHEAD * tonumber(ARGV[1]))
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', until_ms))
end
return lost

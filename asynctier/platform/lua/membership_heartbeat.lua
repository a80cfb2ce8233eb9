-- A scheduler's membership beat: register it until now + ttl with its load and place, and
-- prune the members that expired (O(dead)).
--
-- KEYS[1]  the members (sorted set: address -> expiry, epoch ms)
--          (every key carries the hash tag {schedulers}: one Redis Cluster slot)
-- KEYS[2]  the members' loads (hash: address -> items queued or running)
-- KEYS[3]  the members' places (hash: address -> JSON {"region": ..., "capacity": ...})
-- ARGV[1]  the scheduler's address
-- ARGV[2]  ttl, ms
-- ARGV[3]  its load
-- ARGV[4]  its place (JSON)
-- Returns  Redis' time now, epoch ms.
local now = redis_now_ms()
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, address in ipairs(dead) do
  redis.call('ZREM', KEYS[1], address)
  redis.call('HDEL', KEYS[2], address)
  redis.call('HDEL', KEYS[3], address)
end
redis.call('PEXPIRE', KEYS[1], ttl * 12)
redis.call('PEXPIRE', KEYS[2], ttl * 12)
redis.call('PEXPIRE', KEYS[3], ttl * 12)
return now

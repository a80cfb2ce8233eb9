-- The live schedulers, their loads and places.
--
-- KEYS[1]  the members (sorted set: address -> expiry, epoch ms)
-- KEYS[2]  the members' loads (hash: address -> items queued or running)
-- KEYS[3]  the members' places (hash: address -> JSON {"region": ..., "capacity": ...})
-- Returns  a flat list: address, load, place, address, load, place ... ('' for no place:
--          a scheduler of an older version)
local now = redis_now_ms()
local out = {}
for _, address in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  out[#out + 1] = address
  out[#out + 1] = redis.call('HGET', KEYS[2], address) or '0'
  out[#out + 1] = redis.call('HGET', KEYS[3], address) or ''
end
return out

-- The live schedulers and their loads.
--
-- KEYS[1]  the members (sorted set: address -> expiry, epoch ms)
-- KEYS[2]  the members' loads (hash: address -> items queued or running)
-- Returns  a flat list: address, load, address, load ...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, address in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  out[#out + 1] = address
  out[#out + 1] = redis.call('HGET', KEYS[2], address) or '0'
end
return out

-- Take up to N workloads of a tenant's enqueue capacity in the current minute (a fixed
-- window of Redis TIME), shared by every Submitter process: one round trip per call.
--
-- KEYS[1]  the tenant's capacity (a string: workloads per minute; missing: no limit)
--          (both keys carry the tenant's hash tag: one Redis Cluster slot)
-- KEYS[2]  the tenant's use (hash: m = the minute's id, c = workloads taken in it)
-- ARGV[1]  N, the workloads the call would write
-- ARGV[2]  optional: the time in epoch ms (a clock tests move); Redis TIME when absent
-- Returns  {granted, milliseconds until the minute ends, bad}: granted = N and 0 without
--          a limit; bad = 1 when the capacity is not a whole number >= 0 (then no limit,
--          and the caller says so)
local n = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[1])
if not raw then
  return {n, 0, 0}
end
local cap = tonumber(raw)
if cap == nil or cap < 0 or cap ~= math.floor(cap) then
  return {n, 0, 1}
end
local now
if ARGV[2] then
  now = tonumber(ARGV[2])
else
  now = redis_now_ms()
end
local minute = math.floor(now / 60000)
local used = redis.call('HMGET', KEYS[2], 'm', 'c')
local c = 0
if tonumber(used[1]) == minute then
  c = tonumber(used[2]) or 0
end
local granted = math.max(0, math.min(n, cap - c))
if granted > 0 then
  redis.call('HSET', KEYS[2], 'm', string.format('%d', minute),
             'c', string.format('%d', c + granted))
  redis.call('EXPIRE', KEYS[2], 120)
end
return {granted, (minute + 1) * 60000 - now, 0}

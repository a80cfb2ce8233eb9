-- charge_quota(KEYS, ARGV): charge a tenant for a chunk of items against its per-minute and per-day quotas. An item
-- already charged (the same record seen again) is admitted free; an item that does not
-- fit is returned with the time until the exhausted window resets. Windows are fixed: the
-- minute and the UTC day of Redis TIME.
--
-- What was charged is kept as fields (the source references) of one hash per binding per
-- charge window of ARGV[1] seconds: an item is charged when the current or the previous
-- window's hash has it, and a charge goes to the current one, which expires at the end of
-- the next window (a charge is remembered ARGV[1] to twice ARGV[1] seconds). The caller
-- passes the hashes of windows ARGV[2] .. ARGV[2] + 3 (its own clock's window, two before
-- and one after) as KEYS: the script touches no key it was not given. Every key carries
-- the tenant's hash tag ({tenant:<tenant>}): one Redis Cluster slot.
--
-- KEYS[1]     the tenant's quota (hash: per_minute, per_day; a missing field is no limit;
--             no hash at all: nothing is charged and nothing is written)
-- KEYS[2]     the tenant's usage (hash: m, mc, d, dc: window ids and counts)
-- KEYS[3..6]  the binding's charges in windows ARGV[2] .. ARGV[2] + 3
-- ARGV[1]     seconds a charge window lasts
-- ARGV[2]     the window of KEYS[3]
-- ARGV[3]     the chunk's source references, in order, joined by newlines
-- ARGV[4]     optional: the time in epoch ms (a clock tests move); Redis TIME when absent
-- Returns     a flat list: 1 when the tenant has a quota (0: none, and nothing else), then
--             the values refused (below), then for each item over quota its position
--             (1-based) in the chunk and the milliseconds until it may run; or
--             {2, refused, window} when Redis' charge window is not one whose keys were
--             given (nothing written: ask again with that one).
--
-- A value read that is no such value (anything may write to Redis) is refused: a quota
-- field that is not a whole number >= 1 counts as no limit on its window (as a missing
-- one), a usage count that is not a whole number >= 0 as 0 (the next charge writes it
-- anew). "refused" names them, one "<field>=<value>" a line ('' for none).
--
-- This file defines the function; charge_quota_call.lua calls it with the script's KEYS
-- and ARGV, quota_and_tokens.lua with its share of them.
local function charge_quota(KEYS, ARGV)
  local refused = {}
  local function whole(raw, least, field)
    if raw == false or raw == nil then return nil end
    local v = tonumber(raw)
    if v == nil or v ~= v or v < least or v ~= math.floor(v) or v == math.huge then
      refused[#refused + 1] = field .. '=' .. string.sub(raw, 1, 40)
      return nil
    end
    return v
  end
  local limits = redis.call('HMGET', KEYS[1], 'per_minute', 'per_day')
  local per_minute = whole(limits[1], 1, 'per_minute')
  local per_day = whole(limits[2], 1, 'per_day')
  if per_minute == nil and per_day == nil then
    return {0, table.concat(refused, '\n')}
  end
  local now
  if ARGV[4] then
    now = tonumber(ARGV[4])
  else
    now = redis_now_ms()
  end
  local minute = math.floor(now / 60000)
  local day = math.floor(now / 86400000)
  local used = redis.call('HMGET', KEYS[2], 'm', 'mc', 'd', 'dc')
  local mc = 0
  local dc = 0
  if tonumber(used[1]) == minute then mc = whole(used[2], 0, 'mc') or 0 end
  if tonumber(used[3]) == day then dc = whole(used[4], 0, 'dc') or 0 end
  local ttl = tonumber(ARGV[1])
  local window = math.floor(now / (ttl * 1000))
  local at = window - tonumber(ARGV[2])
  if at < 1 or at > 3 then
    return {2, table.concat(refused, '\n'), string.format('%.0f', window)}
  end
  local cur_charges, prev_charges = KEYS[3 + at], KEYS[2 + at]
  local refs = ARGV[3]
  local over = {1, table.concat(refused, '\n')}
  local charged = 0
  local position = 0
  local start = 1
  while start <= #refs + 1 do
    local stop = string.find(refs, '\n', start, true) or (#refs + 1)
    local ref = string.sub(refs, start, stop - 1)
    start = stop + 1
    position = position + 1
    local wait = 0
    if per_minute ~= nil and mc >= per_minute then
      wait = (minute + 1) * 60000 - now
    end
    if per_day ~= nil and dc >= per_day then
      wait = math.max(wait, (day + 1) * 86400000 - now)
    end
    if redis.call('HEXISTS', prev_charges, ref) == 1 then
      -- charged in the previous window: admitted free
    elseif wait == 0 then
      if redis.call('HSETNX', cur_charges, ref, '1') == 1 then
        mc = mc + 1
        dc = dc + 1
        charged = charged + 1
      end
    elseif redis.call('HEXISTS', cur_charges, ref) == 0 then
      over[#over + 1] = position
      over[#over + 1] = wait
    end
  end
  if charged > 0 then
    redis.call('EXPIREAT', cur_charges, string.format('%.0f', (window + 2) * ttl))
    redis.call('HSET', KEYS[2], 'm', string.format('%.0f', minute), 'mc', mc,
               'd', string.format('%.0f', day), 'dc', dc)
    redis.call('EXPIRE', KEYS[2], 172800)
  end
  return over
end

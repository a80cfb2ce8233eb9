-- Claim every record of a batch for one holder (after once_lib.lua).
--
-- KEYS[1]  this holder's key for the binding (ARGV[2] .. ARGV[1]); every key this script
--          builds (holders, span hashes, bitmaps) starts with the binding's prefix and so
--          carries the same hash tag {once:<binding>}: one Redis Cluster slot
-- ARGV[1]  the holder (this scheduler)
-- ARGV[2]  the holder keys' prefix (a holder is alive while prefix .. holder exists)
-- ARGV[3]  milliseconds a holder key lives
-- ARGV[4]  milliseconds a span lasts
-- ARGV[5]  the binding's hashes' prefix
-- ARGV[6]  the batch's source references, in order, joined by newlines
-- Returns  one code per record, as one string: 0 run, 1 done, 2 busy (a live scheduler
--          runs it), 3 taken over (see asynctier.platform.admission), and 4 for a record
--          this holder claims already, which RunOnce tells apart.
local me = ARGV[1]
local holders = ARGV[2]
redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
local span = tonumber(ARGV[4])
local prefix = ARGV[5]
local refs = split(ARGV[6])
local n = #refs
local cur = math.floor(now / span)
local state = newest(prefix, cur, refs)
local done = done_bits(prefix, cur, refs)
local mine = 'r' .. me
local codes = {}
local claims = {}
local alive = {}
local seen = {}
for i = 1, n do
  local v = done[i] and 'd' or state[i]
  if seen[refs[i]] then
    codes[i] = '2'  -- a second copy in this batch waits for the first
  elseif not v then
    codes[i] = '0'
  elseif v == 'd' then
    codes[i] = '1'
  elseif v == mine then
    codes[i] = '4'  -- this scheduler's: running here, or a claim it could not free
  else
    local holder = string.sub(v, 2)
    local live = alive[holder]
    if live == nil then
      live = redis.call('EXISTS', holders .. holder) == 1
      alive[holder] = live
    end
    codes[i] = live and '2' or '3'
  end
  seen[refs[i]] = true
  if codes[i] == '0' or codes[i] == '3' then
    claims[#claims + 1] = refs[i]
    claims[#claims + 1] = mine
  end
end
write(prefix .. cur, claims, span * (SPANS_KEPT + 1))
return table.concat(codes)

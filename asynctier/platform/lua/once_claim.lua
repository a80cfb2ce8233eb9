-- Claim every record of a batch for one holder (after once_lib.lua).
--
-- KEYS     as once_lib.lua says: KEYS[1] the binding's holders (sorted set: holder ->
--          expiry, epoch ms; a holder is alive until its expiry), then the span hashes,
--          the bitmaps and the running keys this batch may touch; every one carries the binding's hash tag
--          {once:<binding>}: one Redis Cluster slot
-- ARGV[1]  the holder (this scheduler)
-- ARGV[2]  milliseconds a holder lives without being renewed
-- ARGV[3]  milliseconds a span lasts
-- ARGV[4]  the binding's hashes' prefix
-- ARGV[5]  the batch's source references, in order, joined by newlines
-- Returns  one code per record, as one string: 0 run, 1 done, 2 busy (a live scheduler
--          runs it), 3 taken over (see asynctier.scheduler.admission), and 4 for a record
--          this holder claims already, which RunOnce tells apart; or S<span> when Redis'
--          span is not among the ones given (nothing written: ask again with that span).
--          The codes are followed by one line per value refused (once_lib.lua's refuse):
--          a record whose value is neither d nor r<holder> runs (0: its claim replaces
--          the value), a holder whose expiry is far ahead is dropped (3).
--          A record with no claim inside a running range (once_range.lua) is busy while
--          the range's holder lives (2, or 4 for this holder's own) and taken over (3)
--          once it died; the ranges of dead holders are removed.
local me = ARGV[1]
local span = tonumber(ARGV[3])
local prefix = ARGV[4]
local cur = math.floor(now / span)
local skew = skewed(prefix, cur)
if skew then return skew end
hold(me, tonumber(ARGV[2]))
local refs = split(ARGV[5])
local n = #refs
local state, state_span = newest(prefix, cur, refs)
local done = done_bits(prefix, cur, refs)
local mine = 'r' .. me
local codes = {}
local claims = {}
local lives = {}
local seen = {}
for i = 1, n do
  local v = done[i] and 'd' or state[i]
  if seen[refs[i]] then
    codes[i] = '2'  -- a second copy in this batch waits for the first
  elseif not v then
    codes[i] = '0'
    local tp, off = kafka_offset(refs[i])
    local r = tp and covering(prefix, tp, off)
    if r then  -- a fresh copy runs (or ran, its write-down not landed yet)
      if r[3] == me then
        codes[i] = '4'
      else
        local live = lives[r[3]]
        if live == nil then
          live = alive(r[3])
          lives[r[3]] = live
        end
        codes[i] = live and '2' or '3'
      end
    end
  elseif v == 'd' then
    codes[i] = '1'
  elseif not well_formed(v) then
    refuse(prefix .. (state_span[i] or '?'), v, refs[i])
    codes[i] = '0'
  elseif v == mine then
    codes[i] = '4'  -- this scheduler's: running here, or a claim it could not free
  else
    local holder = string.sub(v, 2)
    local live = lives[holder]
    if live == nil then
      live = alive(holder)
      lives[holder] = live
    end
    codes[i] = live and '2' or '3'
  end
  seen[refs[i]] = true
  if codes[i] == '0' or codes[i] == '3' then
    claims[#claims + 1] = refs[i]
    claims[#claims + 1] = mine
  end
end
for tp, ranges in pairs(range_cache) do
  for _, r in ipairs(ranges) do
    if r[3] ~= me and lives[r[3]] == false then
      redis.call('ZREM', key(prefix .. 'running:' .. tp), r[4])
    end
  end
end
write(prefix .. cur, claims, span * (SPANS_KEPT + 1))
return table.concat(codes) .. refused_text()

-- Mark a chunk's successes done and free its other records (a retry runs again): their
-- fields are deleted, so failures cost Redis no memory (after once_lib.lua).
--
-- A record is freed only while this holder's claim is its newest state: a scheduler judged
-- dead (its holder expired while it still ran the record) must not free a record that
-- another scheduler took over, nor undo the success that one had. Such a record is left
-- as it is and reported: when another copy already succeeded (d), this copy's failure
-- is answered ok (the record is done) instead of retried, and it does not run again.
--
-- KEYS     as once_lib.lua says (KEYS[1], the holders, is not touched here)
-- ARGV[1]  milliseconds a span lasts
-- ARGV[2]  the binding's hashes' prefix
-- ARGV[3]  the successes' references joined by newlines ('' for none)
-- ARGV[4]  the others' references joined by newlines ('' for none)
-- ARGV[5]  the holder (this scheduler)
-- ARGV[6]  the running ranges whose records all ended, to remove once their successes
--          are marked: one per line, <topic/partition>\t<member> (once_range.lua)
-- ARGV[7]  more successes, as runs of Kafka offsets (fresh records, which have no claim
--          and always a bit): one per line, <topic/partition>\t<lo>\t<hi> ('' for none)
-- ARGV[8]  more failures (fresh records, which have no claim), as runs of Kafka offsets
--          as in ARGV[7] ('' for none)
-- Returns  one code per other record, as one string: 1 done by another copy, 0 otherwise;
--          those of ARGV[4] first, then those of ARGV[8], offset after offset;
--          or S<span> when Redis' span is not among the ones given (nothing written).
local span = tonumber(ARGV[1])
local prefix = ARGV[2]
local cur = math.floor(now / span)
local skew = skewed(prefix, cur)
if skew then return skew end
local mine = 'r' .. ARGV[5]
local free = split(ARGV[4])
local n = #free
local state = newest(prefix, cur, free)
-- A record still claimed by this holder has no bit: setting a bit deletes every claim of
-- its record, and no record with a bit is claimed. Only the others are looked up (in a
-- retry flood, none).
local others_at = {}
for i = 1, n do
  if state[i] ~= mine then others_at[#others_at + 1] = i end
end
local done = #others_at > 0 and done_bits(prefix, cur, free, others_at) or {}
local gone = {}
local codes = {}
for i = 1, n do
  local v = done[i] and 'd' or state[i]
  if v == mine then
    gone[#gone + 1] = free[i]
  end
  codes[i] = (v == 'd') and '1' or '0'
end
-- A fresh failure has no claim: it is done elsewhere only when a kept span has its bit (a
-- copy taken over, or run unguarded while Redis was away, succeeded).
done_runs(prefix, cur, parse_runs(ARGV[8] or ''), codes)
local ttl = span * (SPANS_KEPT + 1)
local placed, others = set_done(prefix, cur, split(ARGV[3]), ttl)
local runs = parse_runs(ARGV[7] or '')
set_runs(prefix, cur, runs, ttl)
-- A freed record is forgotten (no field: free to CLAIM), in every span kept: a failure
-- leaves nothing behind in Redis, however many attempts a record takes. So is the claim of
-- a success held by its bit.
for _, ref in ipairs(placed) do
  gone[#gone + 1] = ref
end
if #gone > 0 or #runs > 0 then
  for b = cur, cur - (SPANS_KEPT - 1), -1 do
    local hash = key(prefix .. b)
    if redis.call('EXISTS', hash) == 1 then
      if #runs > 0 then  -- a fresh success may hold a claim only if it was taken over
        for _, run in ipairs(runs) do
          for off = run[2], run[3] do
            gone[#gone + 1] = run[1] .. '/' .. string.format('%.0f', off)
          end
        end
        runs = {}
      end
      for s = 1, #gone, 1000 do
        redis.call('HDEL', hash, unpack(gone, s, math.min(s + 999, #gone)))
      end
      drop_if_bare(hash)
    end
  end
end
local marks = {}
for _, ref in ipairs(others) do
  marks[#marks + 1] = ref
  marks[#marks + 1] = 'd'
end
write(prefix .. cur, marks, ttl)
for _, line in ipairs(split(ARGV[6] or '')) do
  local tp, member = string.match(line, '^([^\t]*)\t(.*)$')
  redis.call('ZREM', key(prefix .. 'running:' .. tp), member)
end
return table.concat(codes)

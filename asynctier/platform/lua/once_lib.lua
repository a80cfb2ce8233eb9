-- Functions and values the run-once scripts use (once_claim.lua, once_finish.lua,
-- once_beat.lua). Loaded after the constants SPANS_KEPT, BLOCK and HT_PAD (see once.py).
--
-- Every key a script touches is one of its KEYS, as Redis requires (Redis Cluster routes
-- a call by them): the caller (once.py, run_once_keys) names the binding's holders, the
-- span hashes of spans cur-SPANS_KEPT .. cur+1 of its own clock, and the bitmaps of the
-- batch's (topic/partition, block) pairs in those spans. A script builds each name it
-- uses and passes it through key(), which refuses (an error reply) a name it was not
-- given: Python and Lua disagreeing on a name fails loudly instead of touching a key
-- Redis Cluster may not hold here. A span of Redis TIME outside the ones given (the
-- scheduler's clock a span off) is answered SKEW .. cur before anything is written.

-- Split a newline-joined argument; and the time now (ms) from Redis TIME.
local function split(text)
  local out = {}
  if text == '' then return out end
  local start = 1
  while start <= #text + 1 do
    local stop = string.find(text, '\n', start, true) or (#text + 1)
    out[#out + 1] = string.sub(text, start, stop - 1)
    start = stop + 1
  end
  return out
end
local now = redis_now_ms()

local declared = {}
for i = 1, #KEYS do declared[KEYS[i]] = true end
local function key(name)
  if not declared[name] then
    error(redis.error_reply('ERR run-once: key ' .. name .. ' is not in KEYS (once.py and '
                            .. 'once_lib.lua disagree on key names)'))
  end
  return name
end

-- nil when the span hashes of the SPANS_KEPT spans up to cur are all given; else the
-- SKEW reply (with cur, so that the caller asks again with Redis' span).
local function skewed(prefix, cur)
  for b = cur, cur - (SPANS_KEPT - 1), -1 do
    if not declared[prefix .. b] then return 'S' .. string.format('%.0f', cur) end
  end
  return nil
end

-- Values read that are no such values (anything may write to Redis), refused: one line
-- each, "<key>\t<value>\t<field>", for the caller to say (see refused_text).
local refused = {}
local function refuse(name, value, field)
  refused[#refused + 1] = name .. '\t' .. string.sub(value, 1, 40) .. '\t' .. field
end
local function refused_text()
  if #refused == 0 then return '' end
  return '\n' .. table.concat(refused, '\n')
end

-- Keep holder ``me`` alive ``ttl`` ms more in the holders' sorted set (KEYS[1]: holder ->
-- expiry, epoch ms), drop the expired ones, and let the set expire with its last member.
-- A holder whose expiry is more than HOLDER_AHEAD times ``ttl`` ahead was set by no
-- heartbeat and would keep its claims waiting for ever: refused and dropped here (its
-- claims are taken over).
local HOLDER_AHEAD = 10
local function hold(me, ttl)
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), me)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local far = redis.call('ZRANGEBYSCORE', KEYS[1],
                         '(' .. string.format('%.0f', now + HOLDER_AHEAD * ttl), '+inf',
                         'WITHSCORES')
  for i = 1, #far, 2 do
    refuse(KEYS[1], far[i + 1], far[i])
    redis.call('ZREM', KEYS[1], far[i])
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
end

-- Whether ``holder`` is alive (its expiry in KEYS[1] is still ahead; hold() dropped
-- those too far ahead).
local function alive(holder)
  local expiry = redis.call('ZSCORE', KEYS[1], holder)
  return expiry ~= false and expiry ~= nil and tonumber(expiry) > now
end

-- Running ranges: the fresh records a holder runs without a claim each (once_range.lua),
-- one sorted set per partition at <prefix>running:<topic/partition>, a member
-- "<lo>:<hi>:<holder>" scored by lo per call. ranges_of: a partition's ranges as
-- {lo, hi, holder, member}, read once per script; a member of another form is refused
-- and removed (it would hold nothing).
local range_cache = {}
local function ranges_of(prefix, tp)
  local got = range_cache[tp]
  if got then return got end
  got = {}
  local name = key(prefix .. 'running:' .. tp)
  for _, m in ipairs(redis.call('ZRANGE', name, 0, -1)) do
    local lo, hi, holder = string.match(m, '^(%d+):(%d+):(.+)$')
    if lo and #lo <= 15 and #hi <= 15 then
      got[#got + 1] = {tonumber(lo), tonumber(hi), holder, m}
    else
      refuse(name, m, 'range')
      redis.call('ZREM', name, m)
    end
  end
  range_cache[tp] = got
  return got
end

-- The range of partition ``tp`` that holds offset ``off``, or nil.
local function covering(prefix, tp, off)
  for _, r in ipairs(ranges_of(prefix, tp)) do
    if r[1] <= off and off <= r[2] then return r end
  end
  return nil
end

-- Whether ``v``, a record's value in a span hash, is one: d (done) or r<holder> (claimed).
local function well_formed(v)
  return v == 'd' or (#v > 1 and string.sub(v, 1, 1) == 'r')
end

-- A record's state: its value in the newest of the last SPANS_KEPT hashes that has one;
-- and the span of each value found.
local function newest(prefix, cur, refs)
  local n = #refs
  local state = {}
  local where = {}  -- the span whose hash holds each state found
  local found = 0
  for b = cur, cur - (SPANS_KEPT - 1), -1 do
    if found == n then break end
    local span_key = key(prefix .. b)
    if redis.call('EXISTS', span_key) == 1 then
      for s = 1, n, 1000 do
        local e = math.min(s + 999, n)
        local got = redis.call('HMGET', span_key, unpack(refs, s, e))
        for i = s, e do
          if state[i] == nil and got[i - s + 1] then
            state[i] = got[i - s + 1]
            where[i] = b
            found = found + 1
          end
        end
      end
    end
  end
  return state, where
end

-- A hash written here is a hash table from the start (see HT_FIELD); one left holding that
-- field alone is deleted.
local function write(name, pairs, ttl)
  if #pairs == 0 then return end
  local hash = key(name)
  redis.call('HSET', hash, '\n', string.rep('-', HT_PAD))
  for s = 1, #pairs, 2000 do
    redis.call('HSET', hash, unpack(pairs, s, math.min(s + 1999, #pairs)))
  end
  redis.call('PEXPIRE', hash, ttl)
end

local function drop_if_bare(hash)
  if redis.call('HLEN', hash) == 1 then
    redis.call('DEL', hash)
  end
end

-- Done bits. by_block(refs): the Kafka references grouped by bitmap
-- (<topic>/<partition>:<block>) with their bits, and the others (no offset, an offset
-- with a leading zero, or one too long for a Lua number to hold exactly). done_bits:
-- which of refs have their bit in a kept span. set_done: set the bits of refs in the
-- current span; returns the references placed and the others.
local match, byte, floor, tonumber = string.match, string.byte, math.floor, tonumber
local band, bor, rshift = bit.band, bit.bor, bit.rshift

-- A Kafka reference's partition and offset, or nil. Kafka references grouped by bitmap:
-- a list of {where, list of index, bit, ...}, and the indexes of the other references. once.py's blocks_of follows the same rule (a
-- property test holds them together): a Kafka reference is <where>/<offset>, the offset
-- ASCII digits after the last '/', at most 15 of them, no leading zero.
local function kafka_offset(ref)
  local tp, off = match(ref, '^(.*)/(%d+)$')
  if tp and #off <= 15 and (#off == 1 or byte(off, 1) ~= 48) then
    return tp, tonumber(off)
  end
  return nil
end

local function by_block(refs)
  local tps, order, rest = {}, {}, {}
  local last_tp, blocks
  for i = 1, #refs do
    local tp, off = kafka_offset(refs[i])
    if tp then
      local block = floor(off / BLOCK)
      if tp ~= last_tp then
        blocks = tps[tp]
        if not blocks then
          blocks = {}
          tps[tp] = blocks
        end
        last_tp = tp
      end
      local l = blocks[block]
      if not l then
        l = {}
        blocks[block] = l
        order[#order + 1] = {tp .. ':' .. block, l}
      end
      l[#l + 1] = i
      l[#l + 1] = off - block * BLOCK
    else
      rest[#rest + 1] = i
    end
  end
  return order, rest
end

-- Which of refs (of those at the indexes in ``only``, when given) have their bit set.
local function done_bits(prefix, cur, refs, only)
  local done = {}
  local picked = refs
  if only then
    picked = {}
    for k, i in ipairs(only) do picked[k] = refs[i] end
  end
  local order = by_block(picked)
  for _, group in ipairs(order) do
    local l = group[2]
    for s = cur, cur - (SPANS_KEPT - 1), -1 do
      local bits = redis.call('GET', key(prefix .. s .. ':' .. group[1]))
      if bits then
        for j = 1, #l, 2 do
          local b = l[j + 1]
          local got = byte(bits, floor(b / 8) + 1)
          if got and band(got, rshift(128, b % 8)) ~= 0 then
            done[only and only[l[j]] or l[j]] = true
          end
        end
      end
    end
  end
  return done
end

local function set_done(prefix, cur, refs, ttl)
  local order, rest = by_block(refs)
  local placed, others = {}, {}
  for _, group in ipairs(order) do
    local l = group[2]
    local bitmap = key(prefix .. cur .. ':' .. group[1])
    local bytes, lo, hi = {}, BLOCK, -1
    for j = 1, #l, 2 do
      placed[#placed + 1] = refs[l[j]]
      local b = l[j + 1]
      local k = floor(b / 8)
      bytes[k] = bor(bytes[k] or 0, rshift(128, b % 8))
      if k < lo then lo = k end
      if k > hi then hi = k end
    end
    -- the bytes touched, read, ORed and written back in one piece (at most BLOCK / 8)
    local old = redis.call('GETRANGE', bitmap, lo, hi)
    local out = {}
    for k = lo, hi do
      out[#out + 1] = bor(byte(old, k - lo + 1) or 0, bytes[k] or 0)
    end
    redis.call('SETRANGE', bitmap, lo, string.char(unpack(out)))
    redis.call('PEXPIRE', bitmap, ttl)
  end
  for _, i in ipairs(rest) do others[#others + 1] = refs[i] end
  return placed, others
end

-- Runs of Kafka offsets (fresh records: once.py's runs_of), one per line,
-- <topic/partition>\t<lo>\t<hi> (hi included): parse_runs reads them as {tp, lo, hi};
-- pieces cuts one at its bitmaps' edges, as {block, first bit, last bit} in the block.
local function parse_runs(text)
  local runs = {}
  for _, line in ipairs(split(text)) do
    local tp, lo, hi = match(line, '^([^\t]*)\t(%d+)\t(%d+)$')
    runs[#runs + 1] = {tp, tonumber(lo), tonumber(hi)}
  end
  return runs
end

local function pieces(lo, hi)
  local out = {}
  for block = floor(lo / BLOCK), floor(hi / BLOCK) do
    local base = block * BLOCK
    out[#out + 1] = {block, math.max(lo, base) - base, math.min(hi, base + BLOCK - 1) - base}
  end
  return out
end

-- Set the bits of ``runs`` in the current span, a byte (eight records) at a time.
local lshift = bit.lshift
local function set_runs(prefix, cur, runs, ttl)
  for _, run in ipairs(runs) do
    for _, piece in ipairs(pieces(run[2], run[3])) do
      local block, a, z = piece[1], piece[2], piece[3]
      local first, last = floor(a / 8), floor(z / 8)
      local bitmap = key(prefix .. cur .. ':' .. run[1] .. ':' .. block)
      local old = redis.call('GETRANGE', bitmap, first, last)
      local out = {}
      for k = first, last do
        local mask = 255
        if k == first then mask = band(mask, rshift(255, a % 8)) end
        if k == last then mask = band(mask, band(lshift(255, 7 - z % 8), 255)) end
        out[#out + 1] = bor(byte(old, k - first + 1) or 0, mask)
      end
      redis.call('SETRANGE', bitmap, first, string.char(unpack(out)))  -- <= BLOCK / 8
      redis.call('PEXPIRE', bitmap, ttl)
    end
  end
end

-- One code per offset of ``runs``, in order, appended to ``codes``: 1 when a kept span
-- has its bit, 0 otherwise. Each block's bitmaps are read once; a block with none answers
-- its whole piece 0 at once.
local function done_runs(prefix, cur, runs, codes)
  local maps_of = {}
  for _, run in ipairs(runs) do
    for _, piece in ipairs(pieces(run[2], run[3])) do
      local name = run[1] .. ':' .. piece[1]
      local maps = maps_of[name]
      if not maps then
        maps = {}
        for s = cur, cur - (SPANS_KEPT - 1), -1 do
          local bits = redis.call('GET', key(prefix .. s .. ':' .. name))
          if bits then maps[#maps + 1] = bits end
        end
        maps_of[name] = maps
      end
      if #maps == 0 then
        codes[#codes + 1] = string.rep('0', piece[3] - piece[2] + 1)
      else
        for b = piece[2], piece[3] do
          local at, mask = floor(b / 8) + 1, rshift(128, b % 8)
          local code = '0'
          for _, bits in ipairs(maps) do
            local got = byte(bits, at)
            if got and band(got, mask) ~= 0 then
              code = '1'
              break
            end
          end
          codes[#codes + 1] = code
        end
      end
    end
  end
end

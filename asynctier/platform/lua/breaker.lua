-- A binding's circuit breaker, shared by every scheduler: one hash per binding.
-- States: closed (everything runs), open (records are parked; one probe per probe
-- interval runs), ramp (a probe succeeded: the share of records let through grows from 0
-- to 1 over the ramp time, then closed). The failure ratio is taken over the current and
-- the previous window of window_ms (at least min_calls outcomes).
--
-- KEYS[1]  the breaker (hash: state, changed, win, ok, bad, pok, pbad, probe)
-- ARGV[1]  op: "admit" or "report"
-- ARGV[2]  ratio: opens at this failure share (0 < ratio <= 1)
-- ARGV[3]  window_ms      ARGV[4]  min_calls     ARGV[5]  probe_interval_ms
-- ARGV[6]  ramp_ms
-- ARGV[7]  admit: n, the records offered; report: ok, the successes (not probes)
-- ARGV[8]  report: bad, the failures (not probes)
-- ARGV[9]  report: probes that succeeded     ARGV[10] report: probes that failed
-- ARGV[11] optional: the time in epoch ms (a clock tests move); Redis TIME when absent
-- Returns  {state, admit: records let through (report: 0), 1 when this call changed the
--           state else 0, whether those let through are probes (1) or not (0), the
--           values refused ('' for none: "<field>=<value>", one a line)}.
--
-- A hash holding a value that is no such value (anything may write to Redis: a state
-- other than closed, open or ramp, a count that is not a whole number >= 0, a time that
-- is not one or is ahead of now) is refused whole: the breaker starts afresh, closed, and
-- the call says what it refused (the hash written back is a good one).
local now
if ARGV[11] then
  now = tonumber(ARGV[11])
else
  now = redis_now_ms()
end
local op = ARGV[1]
local ratio = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local min_calls = tonumber(ARGV[4])
local probe_every = tonumber(ARGV[5])
local ramp = tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'state', 'changed', 'win', 'ok', 'bad', 'pok', 'pbad',
                     'probe')
-- A time further ahead of now than this was not written by a clock (a failover to a
-- replica whose clock is a little behind must not reset an open breaker).
local AHEAD_MS = 60000
local refused = {}
local names = {'state', 'changed', 'win', 'ok', 'bad', 'pok', 'pbad', 'probe'}
local known = {closed = true, open = true, ramp = true}
if h[1] and not known[h[1]] then
  refused[#refused + 1] = 'state=' .. string.sub(h[1], 1, 40)
end
for i = 2, 8 do
  local v = h[i] and tonumber(h[i])
  if h[i] and (v == nil or v ~= v or v < 0 or v ~= math.floor(v) or v == math.huge
               or (i <= 3 or i == 8) and v > now + AHEAD_MS) then
    refused[#refused + 1] = names[i] .. '=' .. string.sub(h[i], 1, 40)
  end
end
if #refused > 0 then
  h = {}
end
local state = h[1] or 'closed'
local changed = tonumber(h[2]) or now
local win = tonumber(h[3]) or now
local ok, bad = tonumber(h[4]) or 0, tonumber(h[5]) or 0
local pok, pbad = tonumber(h[6]) or 0, tonumber(h[7]) or 0
local probe = tonumber(h[8]) or 0
local moved = 0

local function set_state(new)
  state, changed, moved = new, now, 1
  ok, bad, pok, pbad, win = 0, 0, 0, 0, now
end

if now - win >= window then  -- the window rolls over
  if now - win >= 2 * window then pok, pbad = 0, 0 else pok, pbad = ok, bad end
  ok, bad, win = 0, 0, now
end

local let, probing = 0, 0
if op == 'admit' then
  local n = tonumber(ARGV[7])
  if state == 'ramp' and now - changed >= ramp then set_state('closed') end
  if state == 'closed' then
    let = n
  elseif state == 'open' then
    if now - probe >= probe_every and n > 0 then
      let, probing, probe = 1, 1, now
    end
  else
    let = math.floor(n * (now - changed) / ramp)
    if let < 1 and n > 0 then let = 1 end
  end
else
  ok = ok + tonumber(ARGV[7])
  bad = bad + tonumber(ARGV[8])
  local probes_ok, probes_bad = tonumber(ARGV[9]), tonumber(ARGV[10])
  local calls = ok + bad + pok + pbad
  if state == 'open' then
    if probes_ok > 0 and probes_bad == 0 then set_state('ramp') end
  elseif calls >= min_calls and (bad + pbad) >= ratio * calls then
    set_state('open')
    probe = now
  end
end

redis.call('HSET', KEYS[1], 'state', state, 'changed', changed, 'win', win, 'ok', ok,
           'bad', bad, 'pok', pok, 'pbad', pbad, 'probe', probe)
redis.call('PEXPIRE', KEYS[1], math.max(window * 4, ramp * 2, 600000))
return {state, let, moved, probing, table.concat(refused, '\n')}

-- take_tokens(KEYS, ARGV): a token bucket that hands out reservations: the tokens are always taken, the bucket may
-- go into debt, and the caller sleeps for the time the debt takes to refill. One round trip
-- per take, whatever n (larger than the burst too), and first come, first served.
--
-- KEYS[1]  the bucket (hash: tokens, ts in microseconds)
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, the bucket's capacity (>= 1)
-- ARGV[3]  n, the tokens to take (>= 1)
-- ARGV[4]  spare (optional, >= 0): up to this many more tokens, taken only from what the
--          bucket holds after the n (never into debt), for the caller to use next
-- Returns  {the microseconds to wait before the n items may start (0: at once),
--           the spare tokens granted, the values refused ('' for none)}.
--
-- A bucket holding a value that is no such value (anything may write to Redis: tokens
-- that are not a finite number, or a debt that would take more than MAX_DEBT_S to
-- refill; a time that is not a whole number or is more than AHEAD_US ahead of now) is
-- refused: the bucket starts full again (written anew) and the call says what it refused.
--
-- This file defines the function; take_tokens_call.lua calls it with the script's KEYS
-- and ARGV, quota_and_tokens.lua with its share of them.
local function take_tokens(KEYS, ARGV)
  local MAX_DEBT_S = 86400
  local AHEAD_US = 60000000
  local now = redis_now_us()
  local rate = tonumber(ARGV[1])
  local burst = tonumber(ARGV[2])
  local n = tonumber(ARGV[3])
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local ts = tonumber(state[2])
  local refused = {}
  if state[1] and (tokens == nil or tokens ~= tokens or tokens == math.huge
                   or tokens < -MAX_DEBT_S * rate) then
    refused[#refused + 1] = 'tokens=' .. string.sub(state[1], 1, 40)
  end
  if state[2] and (ts == nil or ts ~= ts or ts ~= math.floor(ts) or ts < 0
                   or ts > now + AHEAD_US) then
    refused[#refused + 1] = 'ts=' .. string.sub(state[2], 1, 40)
  end
  if tokens == nil or ts == nil or #refused > 0 then
    tokens = burst
  elseif now > ts then
    tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
  end
  tokens = tokens - n
  local spare = 0
  local want = tonumber(ARGV[4]) or 0
  if want > 0 and tokens >= 1 then
    spare = math.min(want, math.floor(tokens))
    tokens = tokens - spare
  end
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens),
             'ts', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) * 1000 / rate) + 1000)
  local wait = 0
  if tokens < 0 then
    wait = math.ceil(-tokens * 1000000 / rate)
  end
  return {wait, spare, table.concat(refused, '\n')}
end

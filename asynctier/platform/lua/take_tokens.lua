-- A token bucket that hands out reservations: the tokens are always taken, the bucket may
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
--           the spare tokens granted}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
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
return {wait, spare}

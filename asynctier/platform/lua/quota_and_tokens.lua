-- Charge a chunk to its tenant's quota and take the tokens of what was admitted from its
-- binding's bucket, in one call (after charge_quota.lua and take_tokens.lua, which say
-- what each part does). For one Redis server only: the quota's keys carry the tenant's
-- hash tag and the bucket's key none, so on a Redis Cluster they live in different slots
-- and no one call may touch both.
--
-- KEYS[1..6]  charge_quota's KEYS        KEYS[7]  take_tokens' KEYS[1] (the bucket)
-- ARGV[1..3]  charge_quota's ARGV[1..3]  ARGV[4]  its ARGV[4] (the time), '' for none
-- ARGV[5]     take_tokens' rate          ARGV[6]  its burst      ARGV[7]  its spare wanted
-- Returns     {charge_quota's reply, take_tokens' reply}: the tokens are taken for the
--             items not over quota ({0, 0, ''} when there are none, nothing written), and
--             not at all ({}) when the quota answered another charge window.
local qargv = {ARGV[1], ARGV[2], ARGV[3]}
if ARGV[4] ~= '' then qargv[4] = ARGV[4] end
local charged = charge_quota({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}, qargv)
if charged[1] == 2 then
  return {charged, {}}
end
local _, newlines = string.gsub(ARGV[3], '\n', '')
local n = newlines + 1 - (#charged - 2) / 2
local taken = {0, 0, ''}
if n > 0 then
  taken = take_tokens({KEYS[7]}, {ARGV[5], ARGV[6], n, ARGV[7]})
end
return {charged, taken}

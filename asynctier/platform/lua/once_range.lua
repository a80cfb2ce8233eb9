-- Say that fresh records run here (after once_lib.lua): one running range per partition
-- of a call, in place of a claim per record. A copy of one of them claimed meanwhile finds
-- the range and waits while its holder lives (once_claim.lua); once_finish.lua removes it
-- with the write-down of the range's last record.
--
-- KEYS     as once_lib.lua says: KEYS[1] the binding's holders, then the partitions'
--          running keys (<prefix>running:<topic/partition>)
-- ARGV[1]  the holder (this scheduler)
-- ARGV[2]  milliseconds a holder lives without being renewed
-- ARGV[3]  milliseconds a running key lives after its last write
-- ARGV[4]  the binding's hashes' prefix
-- ARGV[5]  the ranges, one per line: <topic/partition>\t<lo>:<hi>:<holder>
-- Returns  "1", then one line per holder refused (once_lib.lua's hold and refuse)
hold(ARGV[1], tonumber(ARGV[2]))
local ttl = tonumber(ARGV[3])
for _, line in ipairs(split(ARGV[5])) do
  local tp, member = string.match(line, '^([^\t]*)\t(.*)$')
  local lo = string.match(member, '^(%d+):')
  local name = key(ARGV[4] .. 'running:' .. tp)
  redis.call('ZADD', name, lo, member)
  redis.call('PEXPIRE', name, ttl)
end
return '1' .. refused_text()

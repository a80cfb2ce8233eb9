-- Take a partition's sent mark for a new owner (a tailer given the partition).
--
-- KEYS[1]  the mark: a hash {mark, owner}, under the binding's tag {once:<binding>}
-- ARGV[1]  the new owner
-- Returns  the mark (offsets below it may have been sent), -1 when there is none, or -2
--          when its value is not a whole number >= 0 (records are data: then nothing is
--          taken to be fresh, and the first raise writes a good one)
local raw = redis.call('HGET', KEYS[1], 'mark')
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
if not raw then return -1 end
local mark = tonumber(raw)
if not mark or mark < 0 or mark ~= math.floor(mark) or mark > 9007199254740991 then
  return -2
end
return mark

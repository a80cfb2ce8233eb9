-- Raise a partition's sent mark before its owner sends records below the new value.
--
-- KEYS[1]  the mark: a hash {mark, owner}
-- ARGV[1]  the owner raising it
-- ARGV[2]  the new mark
-- Returns  1 when raised (or already that high), 0 when another owner took the mark since
--          (the partition is another tailer's: the caller sends nothing as fresh)
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local mark = tonumber(redis.call('HGET', KEYS[1], 'mark') or '')
local new = tonumber(ARGV[2])
-- a value that is not a whole number >= 0 is replaced (records are data)
if not mark or mark < 0 or mark ~= math.floor(mark) or mark > 9007199254740991
    or mark < new then
  redis.call('HSET', KEYS[1], 'mark', ARGV[2])
end
return 1

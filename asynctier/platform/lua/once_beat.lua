-- Renew a holder while it holds claims (after once_lib.lua); also drops expired holders.
--
-- KEYS[1]  the binding's holders (sorted set: holder -> expiry, epoch ms)
-- ARGV[1]  the holder (this scheduler)
-- ARGV[2]  milliseconds it lives without being renewed
-- Returns  "1", then one line per holder refused (once_lib.lua's hold and refuse)
hold(ARGV[1], tonumber(ARGV[2]))
return '1' .. refused_text()

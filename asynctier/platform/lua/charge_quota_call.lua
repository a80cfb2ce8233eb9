-- Charge a chunk to its tenant's quota (after charge_quota.lua, which says KEYS and ARGV).
return charge_quota(KEYS, ARGV)

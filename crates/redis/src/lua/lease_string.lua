-- sluice: a lease set of one lease kept as a string, "<id>:<expiry>" (lease_batch.lua writes
-- it so: one SET for the acquire, one GETDEL for the release), turned into the sorted set
-- of that lease with the key's expiry, before a step on sorted sets touches it. Placed
-- before leases.lua and lease_batch.lua. `v` is the string.
local function lease_string_to_zset(key, v)
  local colon = string.find(v, ':', 1, true)
  local ttl = redis.call('PTTL', key)
  redis.call('DEL', key)
  redis.call('ZADD', key, string.sub(v, colon + 1), string.sub(v, 1, colon - 1))
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end

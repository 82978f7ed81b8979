-- sluice: concurrency leases, a line-for-line translation of
-- crates/core/src/algorithm/concurrency.rs and of the memory store's acquire, release and
-- renew (crates/limiter/src/memory/leases.rs), appended to algorithms.lua.
--
-- State layout (one Redis key per concurrency leaf identifier):
--   concurrency     zset    member = lease id (decimal u64, never read as a number),
--                           score = the lease's expiry (microseconds); or, for a set of one
--                           lease written by lease_batch.lua, the string "<id>:<expiry>",
--                           turned into the sorted set before any step here (`as_sorted`)
-- The key's expiry (PEXPIRE) is its latest lease's, so a set whose holders all vanished
-- goes by itself. A release only removes its member: the key may outlive its last
-- unexpired lease until the expiry it had, never longer.

local CONCURRENCY = 5
local leases = {}

-- Redis's own clock, in microseconds: entries take the time from it, never from the caller.
local function redis_time()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local function stamp(n)
  return string.format('%d', n)
end

-- Drops the leases expired at `now` (a lease expiring exactly at `now` has expired).
local function drop_expired(key, now)
  return redis.call('ZREMRANGEBYSCORE', key, '-inf', stamp(now))
end

-- When every lease kept has expired (0 when none is kept).
local function last_expiry(key)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then return tonumber(top[2]) end
  return 0
end

-- A set that lease_batch.lua kept as a string (one lease) becomes a sorted set first.
local function as_sorted(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then lease_string_to_zset(key, v) end
end

function leases.load(key)
  as_sorted(key)
  return { key = key }
end

-- concurrency::verdict from the unexpired leases' count `held` and the time `last` until the
-- latest expires: admitted when `held + cost` fit in the limit; `retry` is the time until
-- enough held leases expire.
local function verdict_of(q, key, now, cost, held, last)
  local limit, lease = q.limit, q.window
  if held + cost <= limit then
    local reset = last
    if cost > 0 then reset = math.max(last, lease) end
    return { allowed = true, limit = limit, remaining = limit - held - cost,
             reset_after = reset, retry = NOW }
  end
  local retry = NEVER
  if cost <= limit then
    -- `cost` slots are free once the `held + cost - limit` earliest leases have expired.
    local needed = held + cost - limit
    local kth = redis.call('ZRANGEBYSCORE', key, '(' .. stamp(now), '+inf', 'WITHSCORES', 'LIMIT', needed - 1, 1)
    retry = 0
    if kth[2] then retry = tonumber(kth[2]) - now end
  end
  return { allowed = false, limit = limit, remaining = math.max(limit - held, 0),
           reset_after = last, retry = retry }
end

function leases.verdict(q, st, now, cost)
  local held = tonumber(redis.call('ZCOUNT', st.key, '(' .. stamp(now), '+inf'))
  return verdict_of(q, st.key, now, cost, held, math.max(last_expiry(st.key) - now, 0))
end

-- Quota::record on a lease set: only drops the expired leases (a hit holds no slot unless
-- it takes a lease, below).
function leases.record(q, st, now)
  drop_expired(st.key, now)
end

function leases.save(key, q, st, now)
  local last = last_expiry(key)
  if last > now then expire(key, last, now) end
end

leases.drop = drop_expired

-- concurrency::renew: pushes lease `id` to one lease time past `now` if it is held; its new
-- expiry, or nil.
local function renew_one(q, key, now, id)
  local score = redis.call('ZSCORE', key, id)
  if not score or tonumber(score) <= now then return nil end
  local at = math.max(now + q.window, tonumber(score))
  redis.call('ZADD', key, stamp(at), id)
  return at
end

-- concurrency::hold: adds lease `id` (renewing it if held), whether a slot is free or not.
function leases.hold(q, key, now, id)
  if not renew_one(q, key, now, id) then
    redis.call('ZADD', key, stamp(now + q.window), id)
  end
end

ALGORITHMS[CONCURRENCY] = leases

-- A reply for one leaf's verdict (Decision::from_verdict).
local function reply_of(v, leaf)
  if v.allowed then return { 1, v.limit, v.remaining, v.reset_after, -1, DENIAL_NONE, leaf } end
  if v.retry == NEVER then return { 0, v.limit, v.remaining, v.reset_after, -1, DENIAL_NEVER, leaf } end
  return { 0, v.limit, v.remaining, v.reset_after, v.retry, DENIAL_LIMITED, leaf }
end

-- Takes lease `id` at `now` for the rule in KEYS and ARGV (as `run` reads them): one step
-- that decides the rate leaves as `run` does and, when the rule admits, holds the lease in
-- every concurrency leaf. A rule of one concurrency leaf without a penalty is
-- concurrency::acquire (taking a lease already held renews it); any other rule is the
-- memory store's acquire_now: expired leases dropped, the rule evaluated, then `hold`.
-- Reply: as `run`'s. The store turns a denial by a concurrency leaf into `Occupied`.
local function acquire(now, id)
  local q = { alg = tonumber(ARGV[6]), limit = tonumber(ARGV[7]), window = tonumber(ARGV[8]) }
  if tonumber(ARGV[5]) == 1 and #KEYS == 1 and q.alg == CONCURRENCY then
    -- The common rule, in as few calls as its answer needs: after the drop, every lease
    -- kept is unexpired, so the set's size is `held`.
    local key = KEYS[1]
    as_sorted(key)
    drop_expired(key, now)
    local score = redis.call('ZSCORE', key, id)
    local held = tonumber(redis.call('ZCARD', key))
    local last = math.max(last_expiry(key) - now, 0)
    if score then
      -- Taking a lease already held renews it.
      local at = math.max(now + q.window, tonumber(score))
      redis.call('ZADD', key, stamp(at), id)
      if at > now + last then
        expire(key, at, now)
        last = at - now
      end
      return reply_of(verdict_of(q, key, now, 0, held, last), 0)
    end
    local v = verdict_of(q, key, now, 1, held, last)
    if v.allowed then
      -- The key lives as long as its latest lease.
      local at = now + q.window
      redis.call('ZADD', key, stamp(at), id)
      if at > now + last then expire(key, at, now) end
    end
    return reply_of(v, 0)
  end
  return run(now, id)
end

-- Releases lease ARGV[1] in every key: 1 released (held by one at least), 2 expired (kept
-- but expired), 0 not held. Other leases and the keys' expiries are left as they are.
local function release(now)
  local id, found = ARGV[1], 0
  for _, key in ipairs(KEYS) do
    as_sorted(key)
    local score = redis.call('ZSCORE', key, id)
    if score then
      redis.call('ZREM', key, id)
      if tonumber(score) > now then
        found = 1
      elseif found == 0 then
        found = 2
      end
    end
  end
  return found
end

-- Renews lease ARGV[1] in every key that holds it, each by its lease time (ARGV[1 + i] for
-- KEYS[i]): the shortest time left then, or -1 when no key holds it.
local function renew(now)
  local id, left = ARGV[1], -1
  for i, key in ipairs(KEYS) do
    as_sorted(key)
    local at = renew_one({ window = tonumber(ARGV[1 + i]) }, key, now, id)
    if at then
      expire(key, last_expiry(key), now)
      if left < 0 or at - now < left then left = at - now end
    end
  end
  return left
end

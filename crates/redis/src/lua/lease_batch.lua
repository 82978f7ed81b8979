-- sluice: the lean script for the lease steps of a rule of one concurrency leaf (acquire,
-- release, renew), for a batch of such steps taken one after the other in one call, in
-- order, each its own answer: a key named twice sees the earlier step's writes.
--
-- Each step is a translation of crates/core/src/algorithm/concurrency.rs (acquire,
-- release, renew) on the lease sets of leases.lua (a sorted set per concurrency identifier:
-- member the lease id, score its expiry in microseconds; the key's expiry its latest
-- lease's), with the same writes and answers as the single-step entries (acquire.lua on a
-- rule of one leaf, release.lua, renew.lua), checked against the same vectors and against
-- the core step by step. Without the library: no table of algorithms built per call, and
-- `now` (integer microseconds, Redis's TIME read once for the batch) is defined by the
-- entry before this text (redis_now.lua, or the tests' `now`).
--
-- What a call has learnt of a key spares asking Redis again (`known` below): a busy lease
-- set gets most of a batch's steps, and each then costs about one write.
--
-- A set of one lease may be a string, "<id>:<expiry>": an acquire on a set with no key
-- that no other step of its call names (kind 4) writes it with one SET NX, and a release
-- its holder sends alone (kinds 5 and 6) takes it with one GETDEL, where a sorted set takes
-- a ZCARD, a ZADD, a PEXPIRE and a ZREM: most per-user sets, most of the time, hold one
-- lease. Any other step turns such a string into the sorted set first (`first`), and a
-- set of two leases or more is always a sorted set.
--
-- KEYS: the lease sets' keys, each once. ARGV: the number of quota sets S, then S pairs
-- (limit, lease time in ticks), then the steps packed in one string (src/lease_batch.rs),
-- each four bytes and the lease id in decimal: kind (1 acquire, 2 release, 3 renew, 0
-- release of a lease its holder knows unexpired; 4, 6 and 5 are 1, 2 and 0 on a key no
-- other step of the call names, 5 and 6 with the id followed by ':'), quota set (from 1, 0
-- for a release), the key's place in KEYS (from 1) and the id's length.
-- Reply: the steps' answers one after the other, in one flat array of integers:
--   acquire: remaining (>= 0), when admitted with reset_after = the lease time and no
--            expired lease dropped; else -1, then code (0 admitted, 1 denied until `retry`,
--            2 denied for good), remaining, reset_after, retry (0 unless code 1) and the
--            expired leases dropped (the store counts leases that expired unreleased)
--   release: 1 released, 2 expired (kept but expired), 0 not held (kinds 0 and 5: 1 or 0)
--   renew:   the time left on the renewed lease, or -1 when it is not held

-- The library functions as locals, as in gcra_batch.lua: a global lookup per use costs.
local max, format, huge = math.max, string.format, math.huge
local call, pcall, find, sub, byte, type =
  redis.call, redis.pcall, string.find, string.sub, string.byte, type
local out, n = {}, 0
local sets = tonumber(ARGV[1])
local limits, leases = {}, {}
for q = 1, sets do
  limits[q], leases[q] = tonumber(ARGV[q * 2]), tonumber(ARGV[q * 2 + 1])
end

-- The steps on sorted sets (and on strings turned into them), made by `general` on the first
-- such step of a call: each function a call makes costs, and most calls on many users'
-- sets need none.
local acquire, release, release_unexpired, renew, ms
local function general()
  local now_s = format('%d', now)

  -- The key lives as long as its latest lease (`expires_at`): max(floor((expires_at - now +
  -- 999) / 1000), 1) milliseconds, in arithmetic rather than calls into C (see gcra_batch.lua
  -- for why, and for why the remainder is exact).
  function ms(expires_at)
    local left = expires_at - now + 999
    local m = (left - left % 1000) / 1000
    if m < 1 then m = 1 end
    return decimal(m)
  end

  local function expire(key, expires_at)
    call('PEXPIRE', key, ms(expires_at))
  end

  -- The first command of the call on a set: a set of one lease kept as a string answers it
  -- with an error, and is turned into the sorted set, which then answers it. Later
  -- commands on the set go straight to Redis.
  local checked = {}
  local function first(key, command, ...)
    if checked[key] then return call(command, key, ...) end
    checked[key] = true
    local answer = pcall(command, key, ...)
    if type(answer) == 'table' and answer.err then
      if not find(answer.err, 'WRONGTYPE', 1, true) then error(answer) end
      lease_string_to_zset(key, call('GET', key))
      return call(command, key, ...)
    end
    return answer
  end

  -- What this call knows of each key an acquire touched. That acquire dropped the expired
  -- leases at `now`, and nothing written since expires by `now` (a lease time is positive),
  -- so no later step finds an expired lease there: a second drop would remove nothing, and a
  -- lease found is unexpired. Of such a key:
  --   size  the set's size (every lease in it held)
  --   mine  lease id -> expiry, for the leases this call wrote (added or renewed)
  --   top   the latest expiry in `mine` (0 when empty)
  --   old   the latest expiry of the other leases, or more once one of them went (huge
  --         until read)
  --   exact whether `old` is still exactly theirs
  -- Every write below keeps these true.
  local known = {}

  -- Leases::expires_at: when every lease kept has expired (0 when none is kept).
  local function expires_at(key, k)
    if k then
      if k.old <= k.top then return k.top end
      if k.exact then return k.old end
    end
    local top = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local latest = 0
    if top[2] then latest = tonumber(top[2]) end
    if k then
      k.old, k.exact = latest, latest > k.top
    end
    return latest
  end

  -- Lease `id` of a known key now expires at `at` (added, or renewed from `before`): when it
  -- was one of the others, their latest may have gone with it.
  local function wrote(k, id, at, before)
    if not k.mine[id] and before and before >= k.old then k.exact = false end
    k.mine[id] = at
    if at > k.top then k.top = at end
  end

  -- Lease `id` left a known key.
  local function went(k, id)
    k.size = k.size - 1
    local at = k.mine[id]
    if not at then
      k.exact = false
      return
    end
    k.mine[id] = nil
    if at == k.top then
      k.top = 0
      for _, other in pairs(k.mine) do
        if other > k.top then k.top = other end
      end
    end
  end

  -- concurrency::renew of lease `id`, held with expiry `score`, in a set whose latest lease
  -- expired at `latest` before: the key then expires with its latest lease, never sooner.
  -- The set's latest expiry now.
  local function renew_held(key, k, lease, id, score, latest)
    local at = max(now + lease, score)
    if at > score then call('ZADD', key, decimal(at), id) end
    if k then wrote(k, id, at, score) end
    if at > latest then
      expire(key, at)
      latest = at
    end
    return latest
  end

  -- concurrency::verdict from the unexpired leases' count `held` and the time `last` until the
  -- latest expires, answered (acquire's integers, after `dropped` expired leases went);
  -- whether it admits.
  local function verdict(limit, lease, key, cost, held, last, dropped)
    if held + cost <= limit then
      local reset = last
      if cost > 0 then reset = max(last, lease) end
      if reset == lease and dropped == 0 then
        n = n + 1
        out[n] = limit - held - cost
      else
        out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] =
          -1, 0, limit - held - cost, reset, 0, dropped
        n = n + 6
      end
      return true
    end
    local code, retry = 2, 0
    if cost <= limit then
      -- `cost` slots are free once the `held + cost - limit` earliest leases have expired.
      local needed = held + cost - limit
      local kth = call('ZRANGEBYSCORE', key, '(' .. now_s, '+inf', 'WITHSCORES', 'LIMIT', needed - 1, 1)
      code = 1
      if kth[2] then retry = tonumber(kth[2]) - now end
    end
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] =
      -1, code, max(limit - held, 0), last, retry, dropped
    n = n + 6
    return false
  end

  -- concurrency::acquire: drops the expired leases, renews `id` if it is held, else takes a
  -- slot if one is free. After the drop every lease kept is unexpired, so the set's size is
  -- `held`; while a slot is free both branches admit, and `ZADD NX` tells which is taken.
  -- `once`: no other step of this call names the key (many users' acquires, the usual
  -- batch), so nothing learnt of it is kept for later steps: no table is made for it, which
  -- on 1,000,000 sets was about a tenth of an acquire + release (lua_instructions.sh,
  -- lease-many).
  function acquire(key, limit, lease, id, once)
    local k = known[key]
    local dropped = 0
    local held, latest
    if k then
      held, latest = k.size, k.top
      if k.old > latest then latest = expires_at(key, k) end
    else
      -- The size first: an empty set (a missing key) has nothing to drop and no latest lease,
      -- so the first acquire on it asks Redis once, not three times.
      local size = first(key, 'ZCARD')
      local old = 0
      if size > 0 then
        dropped = call('ZREMRANGEBYSCORE', key, '-inf', now_s)
        size = size - dropped
        if size > 0 then old = huge end
      end
      held, latest = size, 0
      if not once then
        k = { size = size, mine = {}, top = 0, old = old, exact = false }
        known[key] = k
      end
      if old > 0 then latest = expires_at(key, k) end
    end
    local score
    if held < limit then
      local at = now + lease
      if call('ZADD', key, 'NX', decimal(at), id) == 1 then
        -- concurrency::hold.
        if k then
          k.size = held + 1
          wrote(k, id, at, nil)
        end
        if at > latest then expire(key, at) end
        -- concurrency::verdict of cost 1 with a slot free: admitted, reset after the later
        -- of the set's latest lease and this one (max, without a call into C).
        local reset = latest - now
        if reset < lease then reset = lease end
        if reset == lease and dropped == 0 then
          n = n + 1
          out[n] = limit - held - 1
        else
          out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] =
            -1, 0, limit - held - 1, reset, 0, dropped
          n = n + 6
        end
        return
      end
      score = call('ZSCORE', key, id)
    else
      score = call('ZSCORE', key, id)
      if not score then
        verdict(limit, lease, key, 1, held, max(latest - now, 0), dropped)
        return
      end
    end
    -- Held: renewed, then the verdict of cost 0.
    latest = renew_held(key, k, lease, id, tonumber(score), latest)
    verdict(limit, lease, key, 0, held, max(latest - now, 0), dropped)
  end

  -- concurrency::release: other leases and the key's expiry are left as they are. On a known
  -- key every lease found is unexpired, so the removal alone answers.
  function release(key, id)
    local k = known[key]
    if k then
      if call('ZREM', key, id) == 0 then return 0 end
      went(k, id)
      return 1
    end
    local score = first(key, 'ZSCORE', id)
    if not score then return 0 end
    call('ZREM', key, id)
    if tonumber(score) > now then return 1 end
    return 2
  end

  -- concurrency::release of a lease its holder knows has not expired (the store sends it so
  -- only while the lease time is far from over by the holder's clock): a lease found is
  -- unexpired, so the removal alone answers, as on a known key.
  function release_unexpired(key, id)
    local k = known[key]
    -- `release`'s own lines for a known key, written out: calling it cost a busy set 193
    -- instructions a step (lua_instructions.sh, lease-1).
    if k then
      if call('ZREM', key, id) == 0 then return 0 end
      went(k, id)
      return 1
    end
    if first(key, 'ZREM', id) == 0 then return 0 end
    return 1
  end

  -- concurrency::renew: pushes `id` to one lease time past `now` if it is held; the key then
  -- expires with its latest lease.
  function renew(key, lease, id)
    local score = first(key, 'ZSCORE', id)
    if not score or tonumber(score) <= now then return -1 end
    score = tonumber(score)
    local at = max(now + lease, score)
    call('ZADD', key, decimal(at), id)
    local k = known[key]
    if k then wrote(k, id, at, score) end
    expire(key, expires_at(key, k))
    return at - now
  end
end

-- What a new set's one lease ends with, and its key's expiry, by quota set: made once a call.
local suffixes, expiries = {}, {}
-- The steps, read from their packed string: Redis makes a string and a table slot of every
-- argument, which cost more than reading four bytes and cutting the id out here.
local steps = ARGV[2 + sets * 2]
local pos, size = 1, #steps
while pos <= size do
  local kind, set, place, length = byte(steps, pos, pos + 3)
  local id = sub(steps, pos + 4, pos + 3 + length)
  pos = pos + 4 + length
  local key = KEYS[place]
  if kind == 4 then
    -- A set with no key: its one lease, written as a string with the key's expiry;
    -- concurrency::acquire on an empty set, admitted with one slot taken.
    local limit = limits[set]
    local suffix = suffixes[set]
    if not suffix then
      -- The key's expiry in milliseconds, as `ms` (in `general`) counts it.
      local lease = leases[set]
      local left = lease + 999
      left = (left - left % 1000) / 1000
      if left < 1 then left = 1 end
      suffix = ':' .. decimal(now + lease)
      suffixes[set], expiries[set] = suffix, decimal(left)
    end
    if limit >= 1 and call('SET', key, id .. suffix, 'PX', expiries[set], 'NX') then
      n = n + 1
      out[n] = limit - 1
    else
      -- The set has a key: a sorted set, or a string that `first` turns into one.
      if not acquire then general() end
      acquire(key, limit, leases[set], id, true)
    end
  elseif kind == 5 or kind == 6 then
    -- A string is a set of one lease: taken whole, and answered by whose lease it held.
    local v = pcall('GETDEL', key)
    n = n + 1
    if not v then
      out[n] = 0
    elseif v.err then
      -- Not a string (a string's fields are its library's, which has no `err`): a sorted set.
      if not acquire then general() end
      id = sub(id, 1, length - 1)
      if kind == 5 then out[n] = release_unexpired(key, id) else out[n] = release(key, id) end
    elseif find(v, id, 1, true) == 1 then
      if kind == 5 or tonumber(sub(v, length + 1)) > now then
        out[n] = 1
      else
        out[n] = 2
      end
    else
      -- Another holder's lease: put back, its key expiring with it.
      if not acquire then general() end
      call('SET', key, v, 'PX', ms(tonumber(sub(v, find(v, ':', 1, true) + 1))))
      out[n] = 0
    end
  else
    if not acquire then general() end
    if kind == 1 then
      acquire(key, limits[set], leases[set], id, false)
    elseif kind == 0 then
      n = n + 1
      out[n] = release_unexpired(key, id)
    elseif kind == 2 then
      n = n + 1
      out[n] = release(key, id)
    elseif kind == 3 then
      n = n + 1
      out[n] = renew(key, leases[set], id)
    else
      return redis.error_reply('lease step of unknown kind ' .. kind)
    end
  end
end
return out

-- sluice: the lean script for one sliding-log leaf and no penalty, for a batch of such hits
-- decided one after the other in one call (each its own decision, in order: a key named
-- twice sees the first hit's write), as gcra_batch.lua does for GCRA.
--
-- The same decision and the same log as algorithms.lua's `run` for that shape (log.verdict,
-- log.record, log.save, and `decide` on one leaf), checked against the same vectors, without
-- the library. The state is algorithms.lua's: a sorted set of one member per unit of cost,
-- scored by its time. Unlike the other lean scripts it keeps that state in Redis, not in
-- Lua, and writes as it goes (a log holds up to `limit` members, too many to carry); what it
-- saves are the reads and writes that the batch already knows the answer to:
--   * a key's in-window count (`used`) and its newest score (`top`) are read once per call
--     (the newest first: a key that is absent or wholly out of its window needs no count),
--     then kept up to date as the batch records;
--   * the expired members go once per key (one `ZREMRANGEBYSCORE`: `now` does not move in a
--     call, and nothing the call adds is older than it), and not at all from an empty log;
--   * `ZADD`'s own count of members added replaces `ZCARD`;
--   * the expiry is set once per key, after the last hit, from the newest score it keeps;
--   * a denial's wait (the score of the k-th oldest member in the window) is asked once per
--     key and k until the log changes: a flood of denials costs one read, not one each.
-- `now` (integer microseconds) is defined by the entry before this text (redis_now.lua, or
-- the tests' `now`).
--
-- KEYS: one per hit, the leaf's key. ARGV: the number of parameter sets S, then S sets of
-- four (cost, recording (0 admitted, 1 always, 2 never), limit, window in ticks), then one
-- per hit, in KEYS' order: the number of its set (from 1), left out when S is 1; when S is
-- 1 and every hit names one key (a limit every caller hits), KEYS holds that key once and
-- the number of hits follows the set; when the hits share one set and no key is named twice
-- (a lone hit, or a batch of many users' hits), S is sent as 0 and the set follows, one key
-- per hit. Last, a token unique to the call: each member is
-- "<time>:<token>:<n>", n counting the call's members, so no two members of any call, from
-- any server, are ever the same (a member written twice would count once, and the log would
-- admit more than its limit).
-- Reply: three integers per hit, its verdict, as sliding_batch.lua's: remaining,
-- reset_after, and retry (-1: now, the hit was admitted; -2: never, its cost exceeds the
-- limit; otherwise the ticks to wait).

local format = string.format
-- KEYS and ARGV are globals: locals read them without a lookup by name, once per hit.
local KEYS, ARGV = KEYS, ARGV
local token = ARGV[#ARGV]
ARGV[#ARGV] = nil
local sets = tonumber(ARGV[1])
local params = {}
for s = 1, sets do
  local at = 1 + (s - 1) * 4
  params[format('%d', s)] = { tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
    tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]) }
end
local first = 1 + sets * 4
-- The one set every hit has, when the hits do not name theirs; the one key every hit
-- names, when KEYS holds it once (and the hits' number follows the set).
local only, one, hits = nil, nil, #KEYS
if sets == 1 then
  only = params['1']
  if #ARGV > first then one, hits = KEYS[1], tonumber(ARGV[first + 1]) end
end
local stamp = format('%d', now)

-- What the call knows of each key, for the window it was read for (`wins`; a key named by
-- quotas of two windows is read again for the other): the members in the window (`useds`),
-- the newest score or nil when the log is empty (`tops`), whether its expired members are
-- gone (`cleared`), and the last k-th oldest score asked ({k, score}, `kths`). A key recorded
-- is in `order` once, with the window of its last recording in `saves`.
local wins, useds, tops, cleared, kths, saves, order = {}, {}, {}, {}, {}, {}, {}
local serial = 0

-- log.verdict on `key` holding `used` members in the window, the newest scored `top`:
-- remaining, reset_after, retry (-1 now, -2 never, or ticks).
local function verdict(key, used, top, limit, window, cost)
  local newest = nil
  if used > 0 then newest = top end
  local total = used + cost
  if total <= limit then
    local reset_at = now
    if cost > 0 then reset_at = now + window elseif newest then reset_at = newest + window end
    return limit - total, reset_at - now, -1
  end
  local retry = -2
  if cost <= limit then
    -- The hit fits once the k oldest units have left the window.
    local k = used + cost - limit
    local kth = kths[key]
    if kth == nil or kth[1] ~= k then
      local found = redis.call('ZRANGEBYSCORE', key, '(' .. format('%d', now - window), '+inf',
        'WITHSCORES', 'LIMIT', k - 1, 1)
      kth = { k, tonumber(found[2]) }
      kths[key] = kth
    end
    retry = kth[2] + window - now
  end
  local reset_at = now
  if newest then reset_at = newest + window end
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  return remaining, reset_at - now, retry
end

-- Many users' hits (ARGV '0', then the one set): no key is named twice, so what the loop
-- below keeps in tables for a key's later hits (its count, newest score, whether its
-- expired members went, its denial's wait, its expiry) lives in locals for its one hit,
-- and its expiry is set as it is decided. The window's bound and the expiry of a log whose
-- newest member is `now` are made once a call. benches/lua_instructions.sh, 2,000 calls of
-- 16 keys among 1,000,000: 38,095 instructions a hit through this loop, 47,037 through the
-- general one, whose steps it repeats written out (a local function a step costs a few
-- percent a hit: see sliding_batch.lua).
if sets == 0 then
  local call = redis.call
  local cost, recording, limit, window = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
  local from = now - window
  local after, upto = '(' .. format('%d', from), format('%d', from)
  local left = window + 999
  local fresh_ms = format('%d', (left - left % 1000) / 1000)
  local units = cost
  if units > limit then units = limit end
  local out = {}
  for i = 1, #KEYS do
    local key = KEYS[i]
    local used, top = 0, call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
    if top then
      top = tonumber(top)
      if top > from then used = call('ZCOUNT', key, after, '+inf') end
    end
    local remaining, reset_after, retry = verdict(key, used, top, limit, window, cost)
    if (recording == 0 and retry == -1) or (recording == 1 and retry ~= -2) then
      if top then call('ZREMRANGEBYSCORE', key, '-inf', upto) end
      if used == 0 then top = nil end
      if units > 0 then
        local added = 0
        if units == 1 then
          serial = serial + 1
          added = call('ZADD', key, stamp, stamp .. ':' .. token .. ':' .. serial)
        else
          local args = {}
          for _ = 1, units do
            serial = serial + 1
            args[#args + 1] = stamp
            args[#args + 1] = stamp .. ':' .. token .. ':' .. serial
            if #args >= 2000 then
              added = added + call('ZADD', key, unpack(args))
              args = {}
            end
          end
          if #args > 0 then added = added + call('ZADD', key, unpack(args)) end
        end
        used = used + added
        if used > limit then
          call('ZREMRANGEBYRANK', key, 0, used - limit - 1)
          used = limit
        end
        if top == nil or top < now then top = now end
      end
      kths[key] = nil
      if retry ~= -1 then
        local r2, a2, t2 = verdict(key, used, top, limit, window, cost)
        if t2 ~= -1 then remaining, reset_after, retry = r2, a2, t2 end
      end
      -- log.save
      if top then
        local expires_at = top + window
        if expires_at <= now then
          call('DEL', key)
        elseif top == now then
          call('PEXPIRE', key, fresh_ms)
        else
          local left = expires_at - now + 999
          call('PEXPIRE', key, format('%d', (left - left % 1000) / 1000))
        end
      end
    end
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = remaining, reset_after, retry
  end
  return out
end

local out = {}
for i = 1, hits do
  local p = only or params[ARGV[first + i]]
  local cost, recording, limit, window = p[1], p[2], p[3], p[4]
  local key = one or KEYS[i]
  if wins[key] ~= window then
    -- log.verdict's reads: the newest score, then the members after now - window, which
    -- there are none of when the newest is not.
    local used, top = 0, redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
    if top then
      top = tonumber(top)
      if top > now - window then
        used = redis.call('ZCOUNT', key, '(' .. format('%d', now - window), '+inf')
      end
    end
    wins[key], useds[key], tops[key], cleared[key], kths[key] = window, used, top, false, nil
  end
  local used, top = useds[key], tops[key]
  local remaining, reset_after, retry = verdict(key, used, top, limit, window, cost)
  -- Recorded when admitted unless recording is `never`; denied only when it is `always`,
  -- and never a cost above the limit.
  if (recording == 0 and retry == -1) or (recording == 1 and retry ~= -2) then
    -- log.record: the expired members go (what is left is the `used` in the window; an
    -- empty log has none to lose), then one member per unit, at most `limit`, and the
    -- oldest go when there are more than `limit`.
    if top and not cleared[key] then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - window))
    end
    cleared[key] = true
    if used == 0 then top = nil end
    local units = cost
    if units > limit then units = limit end
    if units > 0 then
      local added = 0
      if units == 1 then
        serial = serial + 1
        added = redis.call('ZADD', key, stamp, stamp .. ':' .. token .. ':' .. serial)
      else
        local args = {}
        for _ = 1, units do
          serial = serial + 1
          args[#args + 1] = stamp
          args[#args + 1] = stamp .. ':' .. token .. ':' .. serial
          if #args >= 2000 then
            added = added + redis.call('ZADD', key, unpack(args))
            args = {}
          end
        end
        if #args > 0 then added = added + redis.call('ZADD', key, unpack(args)) end
      end
      used = used + added
      if used > limit then
        redis.call('ZREMRANGEBYRANK', key, 0, used - limit - 1)
        used = limit
      end
      -- The newest is now, unless Redis's clock stepped back below a member's time.
      if top == nil or top < now then top = now end
    end
    useds[key], tops[key], kths[key] = used, top, nil
    if saves[key] == nil then order[#order + 1] = key end
    saves[key] = window
    if retry ~= -1 then
      -- A counted denial lengthens the wait: the recorded log's verdict, when it denies.
      local r2, a2, t2 = verdict(key, used, top, limit, window, cost)
      if t2 ~= -1 then remaining, reset_after, retry = r2, a2, t2 end
    end
  end
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = remaining, reset_after, retry
end
-- log.save, once per key: the expiry is the newest member's time plus the window of the
-- key's last recording, in whole milliseconds rounded up; an empty log is gone already.
for j = 1, #order do
  local key = order[j]
  local top = tops[key]
  if top then
    local expires_at = top + saves[key]
    if expires_at <= now then
      redis.call('DEL', key)
    else
      local left = expires_at - now + 999
      redis.call('PEXPIRE', key, format('%d', (left - left % 1000) / 1000))
    end
  end
end
return out

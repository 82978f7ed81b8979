-- sluice: the lean script for one sliding-window leaf and no penalty, for a batch of such
-- hits decided one after the other in one call (each its own decision, in order: a key named
-- twice sees the first hit's write), as gcra_batch.lua does for GCRA.
--
-- The same writes and the same decision as algorithms.lua's `run` for that shape
-- (sliding.load, sliding.verdict, sliding.record, sliding.save, and `decide` on one leaf),
-- line for line, checked against the same vectors, without the library. The state is
-- algorithms.lua's: msgpack [newest, c_0 .. c_{G-1}], the newest sub-window written and the
-- counts by sub-window number modulo G. A key named by several hits of the batch is written
-- once, after the last of them, with its final state. `now` (integer microseconds) is
-- defined by the entry before this text (redis_now.lua, or the tests' `now`).
--
-- KEYS: one per hit, the leaf's key. ARGV: the number of parameter sets S, then S sets of
-- five (cost, recording (0 admitted, 1 always, 2 never), limit, sub-window length in ticks,
-- sub-windows G), then one per hit, in KEYS' order: the number of its set (from 1), left out
-- when S is 1. When S is 1 and every hit names one key (a limit every caller hits), KEYS
-- holds that key once and ARGV ends with the number of hits. When the hits share one set
-- and no key is named twice (a lone hit, or a batch of many users' hits), S is sent as 0
-- and the set follows, one key per hit.
-- Reply: three integers per hit, its verdict: remaining, reset_after, and retry (-1: now,
-- the hit was admitted; -2: never, its cost exceeds the limit; otherwise the ticks to wait).
-- Unlike gcra_batch.lua and fixed_batch.lua, the script answers the verdict itself: it
-- depends on every counted sub-window, up to G of them, so the state would be a longer
-- reply than the verdict.
--
-- Sub-windows divide as (a - a % b) / b where algorithms.lua uses floordiv (exact for these
-- integers: see gcra_batch.lua), and no library function is called per hit: only
-- cmsgpack.unpack once per key read and cmsgpack.pack once per key written.

local format = string.format
-- KEYS and ARGV are globals: locals read them without a lookup by name, once per hit.
local KEYS, ARGV = KEYS, ARGV
local sets = tonumber(ARGV[1])
local params = {}
for s = 1, sets do
  local at = 1 + (s - 1) * 5
  params[format('%d', s)] = { tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
    tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]) }
end
local first = 1 + sets * 5
-- The one set every hit has, when the hits do not name theirs; the one key every hit
-- names, when KEYS holds it once (and the hits' number follows the set).
local only, one, hits = nil, nil, #KEYS
if sets == 1 then
  only = params['1']
  if #ARGV > first then one, hits = KEYS[1], tonumber(ARGV[first + 1]) end
end

-- A state is the msgpack array itself, as cmsgpack.unpack gives it and cmsgpack.pack takes
-- it: st[1] the newest sub-window written, st[2 + j] the count of sub-windows numbered j
-- modulo G; nothing is copied between the stored form and the one the hits use.

-- Zeros to build a fresh state from in one step ({unpack(zeros, 1, G + 1)}: one table sized
-- once, where filling one slot after another would grow it four times).
local zeros = {}
local function fresh(g)
  for j = #zeros + 1, g + 1 do zeros[j] = 0 end
  return { unpack(zeros, 1, g + 1) }
end

-- sliding.verdict on state `st` at sub-window `current` (now // sub): remaining,
-- reset_after, retry (-1 now, -2 never, or ticks). sw_count is 0 outside the sub-windows
-- newest - G + 1 .. newest, so the loops run only where those meet the counted ones
-- (oldest .. current); the retry loop can only stop after a count it takes off, so it
-- skips the same sub-windows.
local function verdict(st, limit, sub, g, cost, current)
  local newest = st[1]
  local oldest = current + 1 - g
  if oldest < 0 then oldest = 0 end
  local lo, hi = oldest, current
  if newest - g + 1 > lo then lo = newest - g + 1 end
  if newest < hi then hi = newest end
  local used, last = 0, nil
  for n = lo, hi do
    local k = st[2 + n % g]
    used = used + k
    if k > 0 then last = n end
  end
  local total = used + cost
  if total <= limit then
    if cost > 0 then last = current end
    local reset_at = now
    if last then reset_at = (last + g) * sub end
    return limit - total, reset_at - now, -1
  end
  local retry = -2
  if cost <= limit then
    local left, retry_at = used, now
    for n = lo, hi do
      if left + cost <= limit then break end
      local k = st[2 + n % g]
      if k > 0 then
        left = left - k
        retry_at = (n + g) * sub
      end
    end
    retry = retry_at - now
  end
  local reset_at = now
  if last then reset_at = (last + g) * sub end
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  return remaining, reset_at - now, retry
end

-- One hit of `cost` on state `st` at sub-window `current`: its verdict, and whether it was
-- recorded (in `st`, in place). Recorded when admitted unless recording is `never`; denied
-- only when it is `always`, and never a cost above the limit.
local function step(st, cost, recording, limit, sub, g, current)
  local remaining, reset_after, retry = verdict(st, limit, sub, g, cost, current)
  if (recording == 0 and retry == -1) or (recording == 1 and retry ~= -2) then
    -- sliding.record
    local newest = st[1]
    if current > newest then
      local stale = current - newest
      if stale > g then stale = g end
      for n = current + 1 - stale, current do st[2 + n % g] = 0 end
      newest = current
      st[1] = current
    end
    local slot = 2 + newest % g
    local total = st[slot] + cost
    if total > limit * 2 then total = limit * 2 end
    st[slot] = total
    if retry ~= -1 then
      -- A counted denial lengthens the wait: the recorded state's verdict, when it denies.
      local r2, a2, t2 = verdict(st, limit, sub, g, cost, current)
      if t2 ~= -1 then remaining, reset_after, retry = r2, a2, t2 end
    end
    return remaining, reset_after, retry, true
  end
  return remaining, reset_after, retry, false
end

-- sliding.save: the state as stored and its expiry (the end of the window of its newest
-- counted sub-window, in whole milliseconds rounded up, at least 1), or nil when nothing in
-- it is still counted (the key is deleted).
local function stored(st, g, sub)
  local newest = st[1]
  local expires_at = 0
  for back = 0, g - 1 do
    local n = newest - back
    if n < 0 then break end
    if st[2 + n % g] > 0 then
      expires_at = (n + g) * sub
      break
    end
  end
  if expires_at <= now then return nil end
  local left = expires_at - now + 999
  return cmsgpack.pack(st), format('%d', (left - left % 1000) / 1000)
end

-- Writes `st`, recorded, under `key` (see `stored`).
local function save(key, st, g, sub)
  local text, ms = stored(st, g, sub)
  if text then redis.call('PSETEX', key, ms, text) else redis.call('DEL', key) end
end

-- A state read from Redis, or nil when there is none of G sub-windows: a state of another
-- G is taken as fresh, as the full script takes what it saved for another quota.
local function loaded(raw, g)
  if not raw then return nil end
  local ok, packed = pcall(cmsgpack.unpack, raw)
  if ok and type(packed) == 'table' and #packed == g + 1 then return packed end
  return nil
end

-- Many users' hits (ARGV '0', then the one set): no key is named twice, so each key's
-- final state is its one hit's, written as it is decided, with none of the tables below
-- that find a key named again. Every missing key (the usual one among many users) gets the
-- same answer and the same write, so a fresh state is decided, recorded and packed once a
-- call, not once a key. The functions above are the general loop's steps below, which
-- keeps them written out: called from it, they cost 5-6% more instructions a hit
-- (benches/lua_instructions.sh, sliding-1 and sliding-many-general). On 1,000,000 keys,
-- 2,000 calls of 16: 23,636 instructions a hit through this loop, 47,880 through the
-- general one.
if ARGV[1] == '0' then
  local cost, recording, limit = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
  local sub, g = ARGV[5] + 0, ARGV[6] + 0
  local current = (now - now % sub) / sub
  local read = redis.call('MGET', unpack(KEYS))
  local out = {}
  -- A missing key's verdict and write, made at the first one (`text` nil: nothing to
  -- write; false: delete the key, which holds something that is not a state of this G).
  local fr, fa, ft, text, ms
  for i = 1, #KEYS do
    local st = loaded(read[i], g)
    local remaining, reset_after, retry
    if st then
      local recorded
      remaining, reset_after, retry, recorded = step(st, cost, recording, limit, sub, g, current)
      if recorded then save(KEYS[i], st, g, sub) end
    else
      if not fr then
        local recorded
        st = fresh(g)
        fr, fa, ft, recorded = step(st, cost, recording, limit, sub, g, current)
        if recorded then text, ms = stored(st, g, sub) end
        if recorded and not text then text = false end
      end
      remaining, reset_after, retry = fr, fa, ft
      if text then
        redis.call('PSETEX', KEYS[i], ms, text)
      elseif text == false then
        redis.call('DEL', KEYS[i])
      end
    end
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = remaining, reset_after, retry
  end
  return out
end

local out = {}
-- Every key read in one command. Each key's state, once read or recorded, is kept for the
-- batch's later hits (`states`, with its G in `gs`); a key recorded is in `order` once, with
-- its sub-window length in `subs`.
local read = redis.call('MGET', unpack(KEYS))
local states, gs, subs, order = {}, {}, {}, {}
for i = 1, hits do
  local p = only or params[ARGV[first + i]]
  local cost, recording, limit, sub, g = p[1], p[2], p[3], p[4], p[5]
  local key = one or KEYS[i]
  -- sliding.load: the state recorded earlier in the batch, else the one read (kept for the
  -- next hit of the same G). A state of another G is taken as fresh, as the full script
  -- takes what it saved for another quota.
  local st = states[key]
  if gs[key] ~= g then
    if subs[key] ~= nil then
      st = fresh(g)
    else
      local raw = read[one and 1 or i]
      local ok, packed = false, nil
      if raw then ok, packed = pcall(cmsgpack.unpack, raw) end
      if ok and type(packed) == 'table' and #packed == g + 1 then st = packed else st = fresh(g) end
      states[key], gs[key] = st, g
    end
  end
  local current = (now - now % sub) / sub
  local remaining, reset_after, retry = verdict(st, limit, sub, g, cost, current)
  -- Recorded when admitted unless recording is `never`; denied only when it is `always`,
  -- and never a cost above the limit.
  if (recording == 0 and retry == -1) or (recording == 1 and retry ~= -2) then
    -- sliding.record
    local newest = st[1]
    if current > newest then
      local stale = current - newest
      if stale > g then stale = g end
      for n = current + 1 - stale, current do st[2 + n % g] = 0 end
      newest = current
      st[1] = current
    end
    local slot = 2 + newest % g
    local total = st[slot] + cost
    if total > limit * 2 then total = limit * 2 end
    st[slot] = total
    if subs[key] == nil then order[#order + 1] = key end
    states[key], gs[key], subs[key] = st, g, sub
    if retry ~= -1 then
      -- A counted denial lengthens the wait: the recorded state's verdict, when it denies.
      local r2, a2, t2 = verdict(st, limit, sub, g, cost, current)
      if t2 ~= -1 then remaining, reset_after, retry = r2, a2, t2 end
    end
  end
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = remaining, reset_after, retry
end
-- sliding.save, once per key: the state with its expiry (the end of the window of its
-- newest counted sub-window, in whole milliseconds rounded up, at least 1) in the same
-- command, or the key deleted when nothing in it is still counted.
for j = 1, #order do
  local key = order[j]
  local st, g, sub = states[key], gs[key], subs[key]
  local newest = st[1]
  local expires_at = 0
  for back = 0, g - 1 do
    local n = newest - back
    if n < 0 then break end
    if st[2 + n % g] > 0 then
      expires_at = (n + g) * sub
      break
    end
  end
  if expires_at <= now then
    redis.call('DEL', key)
  else
    local left = expires_at - now + 999
    local ms = format('%d', (left - left % 1000) / 1000)
    redis.call('PSETEX', key, ms, cmsgpack.pack(st))
  end
end
return out

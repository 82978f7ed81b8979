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
-- when S is 1.
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
local sets = tonumber(ARGV[1])
local params = {}
for s = 1, sets do
  local at = 1 + (s - 1) * 5
  params[format('%d', s)] = { tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
    tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]) }
end
local first = 1 + sets * 5
local only = nil
if sets == 1 then only = params['1'] end

-- sliding.verdict on counts `c` (by number modulo g) whose newest sub-window is `newest`:
-- remaining, reset_after, retry (-1 now, -2 never, or ticks).
local function verdict(c, newest, limit, sub, g, cost)
  local current = (now - now % sub) / sub
  local oldest = current + 1 - g
  if oldest < 0 then oldest = 0 end
  local used, last = 0, nil
  for n = oldest, current do
    -- sw_count: 0 outside the sub-windows `newest` still holds.
    if n <= newest and n + g > newest then
      local k = c[n % g]
      used = used + k
      if k > 0 then last = n end
    end
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
    for n = oldest, current do
      if left + cost <= limit then break end
      if n <= newest and n + g > newest then
        local k = c[n % g]
        if k > 0 then
          left = left - k
          retry_at = (n + g) * sub
        end
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

local out = {}
-- Every key read in one command; a key named again later in the batch reads what the hits
-- before it recorded (`counts`, `newests`: each recorded key's state, `subs` its sub-window
-- length; `order`: those keys, each once).
local read = redis.call('MGET', unpack(KEYS))
local counts, newests, subs, order = {}, {}, {}, {}
for i = 1, #KEYS do
  local p = only or params[ARGV[first + i]]
  local cost, recording, limit, sub, g = p[1], p[2], p[3], p[4], p[5]
  local key = KEYS[i]
  -- sliding.load: the state recorded earlier in the batch, else the one read. One recorded
  -- with another G is taken as fresh, as the full script takes what it saved for another
  -- quota (it is replaced only if this hit records).
  local c, newest = counts[key], newests[key]
  if c == nil or c.g ~= g then
    local raw = nil
    if c == nil then raw = read[i] end
    c, newest = { g = g }, 0
    local ok, packed = false, nil
    if raw then ok, packed = pcall(cmsgpack.unpack, raw) end
    if ok and type(packed) == 'table' and #packed == g + 1 then
      newest = packed[1]
      for j = 1, g do c[j - 1] = packed[j + 1] end
    else
      for j = 0, g - 1 do c[j] = 0 end
    end
  end
  local remaining, reset_after, retry = verdict(c, newest, limit, sub, g, cost)
  -- Recorded when admitted unless recording is `never`; denied only when it is `always`,
  -- and never a cost above the limit.
  if (recording == 0 and retry == -1) or (recording == 1 and retry ~= -2) then
    -- sliding.record
    local current = (now - now % sub) / sub
    if current > newest then
      local stale = current - newest
      if stale > g then stale = g end
      for n = current + 1 - stale, current do c[n % g] = 0 end
      newest = current
    end
    local slot = newest % g
    local total = c[slot] + cost
    if total > limit * 2 then total = limit * 2 end
    c[slot] = total
    if counts[key] == nil then order[#order + 1] = key end
    counts[key], newests[key], subs[key] = c, newest, sub
    if retry ~= -1 then
      -- A counted denial lengthens the wait: the recorded state's verdict, when it denies.
      local r2, a2, t2 = verdict(c, newest, limit, sub, g, cost)
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
  local c, newest, sub = counts[key], newests[key], subs[key]
  local g = c.g
  local expires_at = 0
  for back = 0, g - 1 do
    local n = newest - back
    if n < 0 then break end
    if c[n % g] > 0 then
      expires_at = (n + g) * sub
      break
    end
  end
  if expires_at <= now then
    redis.call('DEL', key)
  else
    local packed = { newest }
    for k = 0, g - 1 do packed[k + 2] = c[k] end
    local left = expires_at - now + 999
    redis.call('SET', key, cmsgpack.pack(packed), 'PX', format('%d', (left - left % 1000) / 1000))
  end
end
return out

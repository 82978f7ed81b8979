-- sluice: the lean script for one fixed-window leaf and no penalty, for a batch of such hits
-- decided one after the other in one call (each its own decision, in order: a key named
-- twice sees the first hit's write), as gcra_batch.lua does for GCRA.
--
-- The same writes as algorithms.lua's `run` for that shape (fixed.verdict, fixed.record,
-- fixed.save), line for line, checked against the same vectors, without the library. The
-- state is algorithms.lua's: "<window>:<count>", the window's number (now // length) and
-- its count. A key named by several hits of the batch is written once, after the last of
-- them, with its final state. `now` (integer microseconds) is defined by the entry before
-- this text (redis_now.lua, or the tests' `now`).
--
-- KEYS: one per hit, the leaf's key. ARGV: the number of parameter sets S, then S sets of
-- four (cost, recording (0 admitted, 1 always, 2 never), limit, window length in ticks),
-- then one per hit, in KEYS' order: the number of its set (from 1), left out when S is 1.
-- When the hits share one set and no key is named twice (a lone hit, or a batch of many
-- users' hits), S is sent as 0 and the set follows, one key per hit.
-- Reply: two integers per hit: the count its window held before it (0 for a window that
-- has passed), and the time from `now` to the window's end. The store turns them into the
-- decision with the core's fixed window, which depends on `now` only through that time.
--
-- Windows divide as (a - a % b) / b where algorithms.lua uses floordiv (exact for these
-- integers: see gcra_batch.lua), and no library function is called per hit but the
-- parse of a stored state, as in gcra_batch.lua.

local format = string.format
-- KEYS and ARGV are globals: locals read them without a lookup by name, once per hit.
local KEYS, ARGV = KEYS, ARGV
-- Many users' hits (ARGV '0', then the one set): each key's final state is its one hit's,
-- so it is written in the loop, with none of the tables below that find a key named again;
-- the window, its end and the expiry are the set's, computed once, and the written state's
-- text is made again only when its count changes. A count of 0 (a cost of 0 on a passed
-- window) deletes the key, as fixed.save does. benches/lua_instructions.sh, 2,000 calls of
-- 16 keys among 1,000,000: 19,300 instructions a hit through this loop, 29,251 through the
-- general one.
if ARGV[1] == '0' then
  local call, match = redis.call, string.match
  local cost, recording, limit, length = ARGV[2] + 0, ARGV[3], ARGV[4] + 0, ARGV[5] + 0
  local current = (now - now % length) / length
  local ends, cap = (current + 1) * length - now, limit * 2
  local admitted, always = recording == '0', recording == '1'
  local left = ends + 999
  local ms = format('%d', (left - left % 1000) / 1000)
  local read = call('MGET', unpack(KEYS))
  local out, last, text = {}, nil, nil
  for i = 1, #KEYS do
    local used = 0
    local raw = read[i]
    if raw then
      local w, c = match(raw, '^(%d+):(%d+)$')
      if w and w + 0 == current then used = c + 0 end
    end
    if (admitted and used + cost <= limit) or (always and cost <= limit) then
      local total = used + cost
      if total > cap then total = cap end
      if total > 0 then
        if total ~= last then last, text = total, format('%d:%d', current, total) end
        call('PSETEX', KEYS[i], ms, text)
      else
        call('DEL', KEYS[i])
      end
    end
    out[2 * i - 1], out[2 * i] = used, ends
  end
  return out
end
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
local out = {}
-- Every key read in one command; a key named again later in the batch reads what the hits
-- before it recorded (`windows`, `counts`: each recorded key's state; `lengths`: its window
-- length; `order`: those keys, each once).
local read = redis.call('MGET', unpack(KEYS))
local windows, counts, lengths, order = {}, {}, {}, {}
for i = 1, hits do
  local p = only or params[ARGV[first + i]]
  local cost, recording, limit, length = p[1], p[2], p[3], p[4]
  local key = one or KEYS[i]
  -- fixed.load
  local window, count = windows[key], counts[key]
  if window == nil then
    window, count = 0, 0
    local raw = read[one and 1 or i]
    if raw then
      local w, c = string.match(raw, '^(%d+):(%d+)$')
      if w then window, count = tonumber(w), tonumber(c) end
    end
  end
  -- fixed.verdict: the count so far in the current window.
  local current = (now - now % length) / length
  local used = 0
  if window == current then used = count end
  -- Recorded when admitted unless recording is `never`; denied only when it is `always`,
  -- and never a cost above the limit (fixed.verdict's `retry` is then NEVER).
  if (recording == 0 and used + cost <= limit) or (recording == 1 and cost <= limit) then
    -- fixed.record
    local total = used + cost
    if total > limit * 2 then total = limit * 2 end
    if windows[key] == nil then order[#order + 1] = key end
    windows[key], counts[key], lengths[key] = current, total, length
  end
  out[2 * i - 1], out[2 * i] = used, (current + 1) * length - now
end
-- fixed.save, once per key: the state with its expiry (the window's end, in whole
-- milliseconds rounded up, at least 1) in the same command, or the key deleted when its
-- count is 0 or its window has ended.
for j = 1, #order do
  local key = order[j]
  local count = counts[key]
  local expires_at = 0
  if count > 0 then expires_at = (windows[key] + 1) * lengths[key] end
  if expires_at <= now then
    redis.call('DEL', key)
  else
    local left = expires_at - now + 999
    local ms = format('%d', (left - left % 1000) / 1000)
    redis.call('PSETEX', key, ms, format('%d:%d', windows[key], count))
  end
end
return out

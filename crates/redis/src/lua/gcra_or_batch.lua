-- sluice: the lean script for a rule of several GCRA leaves joined by `;` (`or`: the hit is
-- denied when any leaf would be exceeded), without a penalty, for a batch of such hits
-- decided one after the other in one call (each its own decision, in order: a key named by
-- several hits, such as a limit every caller shares, sees the earlier hits' writes), as
-- gcra_batch.lua does for one leaf.
--
-- The same writes as algorithms.lua's `run` for that shape (gcra.verdict of each leaf, the
-- `or` fold's verdict, gcra.record and gcra.save of each leaf), line for line, without the
-- library. A key named by several hits of the batch is written once, after the last of them.
-- `now` (integer microseconds) is defined by the entry before this text (redis_now.lua, or
-- the tests' `now`), `decimal` by decimal.lua.
--
-- KEYS: each hit's leaves' keys, in the rule's leaf order, hit after hit. ARGV: the number
-- of parameter sets S, then S sets, each cost, recording (0 admitted, 1 always, 2 never),
-- the number of leaves L, and L triples (interval, burst, window in ticks); then one per
-- hit, in order: the number of its set (from 1), left out when S is 1.
-- Reply: one integer per leaf of each hit, hit after hit: the leaf's debt before the hit
-- (max(tat, now) - now). The store turns them into the decision with the core's rule
-- evaluation (each GCRA verdict depends on `now` and the TAT only through the debt).
--
-- Recording: the `or` is reached when any leaf is, so the hit is admitted when every leaf
-- admits it. A denial is recorded (recording `always`) unless its wait is never: that is
-- when some leaf's cost exceeds its capacity (such a leaf is always reached, and `or` waits
-- for its latest reached leaf). Arithmetic as in gcra_batch.lua: no library function per
-- hit.

local format = string.format
local sets = tonumber(ARGV[1])
-- Keyed by the set's number as its hits name it (a string). A set: cost, recording, its
-- number of leaves, then interval, burst, window of each.
local params = {}
local at = 2
for s = 1, sets do
  local leaves = tonumber(ARGV[at + 2])
  if leaves == nil or leaves < 1 then return redis.error_reply('a parameter set without leaves') end
  local p = { tonumber(ARGV[at]), tonumber(ARGV[at + 1]), leaves }
  for j = 1, 3 * leaves do p[3 + j] = tonumber(ARGV[at + 2 + j]) end
  params[format('%d', s)] = p
  at = at + 3 + 3 * leaves
end
local first = at - 1
local only = nil
if sets == 1 then only = params['1'] end

local out = {}
-- Every key read in one command; a key named again later in the batch reads what the hits
-- before it recorded (`written`: each recorded key's latest TAT; `order`: those keys, each
-- once).
local read = redis.call('MGET', unpack(KEYS))
local written, order = {}, {}
-- Where this hit's keys start in KEYS (less one), and its debts in `out`.
local base, hit = 0, 0
local tats = {}
while base < #KEYS do
  hit = hit + 1
  local p = only or params[ARGV[first + hit]]
  local cost, recording, leaves = p[1], p[2], p[3]
  -- gcra.verdict of each leaf, and the fold: admitted when every leaf admits; recorded
  -- only if no leaf's cost exceeds its capacity.
  local admits, fits = true, true
  for j = 1, leaves do
    local key = KEYS[base + j]
    local tat = written[key]
    if tat == nil then
      local value = read[base + j]
      tat = value and tonumber(value) or 0
    end
    tats[j] = tat
    local interval, burst = p[1 + 3 * j], p[2 + 3 * j]
    local tau = burst * interval
    local inc = cost * interval
    local from = tat
    if from < now then from = now end
    local debt = from - now
    out[#out + 1] = debt
    if inc > tau then fits = false end
    if debt > tau - inc then admits = false end
  end
  if recording ~= 2 and fits and (recording == 1 or admits) then
    for j = 1, leaves do
      -- gcra.record: max(min(max(tat, now) + inc, now + tau + window), tat).
      local key = KEYS[base + j]
      local interval, burst, window = p[1 + 3 * j], p[2 + 3 * j], p[3 + 3 * j]
      local tat = tats[j]
      local from = tat
      if from < now then from = now end
      local recorded, cap = from + cost * interval, now + burst * interval + window
      if recorded > cap then recorded = cap end
      if recorded < tat then recorded = tat end
      if written[key] == nil then order[#order + 1] = key end
      written[key] = recorded
    end
  end
  base = base + leaves
end
-- gcra.save, once per key, as in gcra_batch.lua: the final TAT with its expiry in the same
-- command, or the key deleted when that TAT is not later than now.
for j = 1, #order do
  local key = order[j]
  local recorded = written[key]
  if recorded <= now then
    redis.call('DEL', key)
  else
    local left = recorded - now + 999
    redis.call('SET', key, decimal(recorded), 'PX', decimal((left - left % 1000) / 1000))
  end
end
return out

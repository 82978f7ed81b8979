-- sluice: the lean script for the common hit, one GCRA leaf and no penalty, for a batch of
-- such hits decided one after the other in one call (each its own decision, in order: a key
-- named twice sees the first hit's write).
--
-- The same writes as algorithms.lua's `run` for that shape (gcra.verdict, gcra.record,
-- gcra.save), line for line, checked against the same vectors, without the library: no
-- function or table built per call but the reply, no rule tree, one `PSETEX` per key
-- written. `PSETEX key ms value` is `SET key value PX ms` with one argument fewer for Lua to
-- turn into a Redis string and no options for Redis to parse: 2.6% fewer instructions a hit
-- on 1,000,000 keys (lua_instructions.sh, rate-many). Redis's documentation calls it
-- deprecated in favour of SET's options, which in Redis removes nothing: it stays a command.
-- The other batch scripts write their states the same way.
-- A key named by several hits of the batch is written once, after the last of them: each hit
-- reads what the one before it recorded (`written`), and nothing else runs between them, so
-- only the final state and its expiry can ever be seen.
-- `now` (integer microseconds) is defined by the entry before this text (redis_now.lua, or
-- the tests' `now`).
--
-- KEYS: one per hit, the leaf's key, state "<tat>". ARGV: the number of parameter sets S,
-- then S sets of five (cost, recording (0 admitted, 1 always, 2 never), interval, burst,
-- window in ticks), then one per hit, in KEYS' order: the number of its set (from 1), left
-- out when S is 1 (every hit has that set). Hits of one policy share a set, so a batch's
-- arguments are mostly one small number per hit, or none. When S is 1 and every hit names
-- one key (a limit every caller hits), KEYS holds that key once and ARGV ends with the
-- number of hits. When the hits share one set and no key is named twice (a lone hit, or a
-- batch of many users' hits), S is sent as 0 and the set follows: `0 cost recording
-- interval burst window`, one key per hit.
-- Reply: one integer per hit, its debt before the hit (max(tat, now) - now). The store turns
-- it into the decision with the core's GCRA (the verdict depends on `now` and the TAT only
-- through it), so the reply costs one integer, not a table of seven.
--
-- The expiry divides as (a - a % b) / b where algorithms.lua uses floordiv: Lua computes
-- a % b as a - floor(a / b) * b, and for integers 0 <= a < 2^53 and b >= 1 the double
-- quotient never rounds up to the next integer (it would take an error of 1/b, and the
-- error is at most a/b * 2^-53), so the remainder is exact, a - a % b an exact multiple of
-- b, and the two agree here.
--
-- No library function is called per hit: math.max, math.min and math.floor are written as
-- comparisons and arithmetic, the loop over written keys counts instead of calling
-- ipairs, and a missing key skips tonumber. Each call into a C function costs Redis about
-- 300 instructions (benches/lua_instructions.sh, 2,000 calls: a hit went from 9,848 to 8,509
-- instructions on one key, and from 28,673 to 26,440 on 1,000,000 keys).
local format = string.format
-- KEYS and ARGV are globals: locals read them without a lookup by name, once per hit.
local KEYS, ARGV = KEYS, ARGV
-- The common batch of many users: one parameter set, every key named once (ARGV '0', then
-- the set). Each key's final state is then its one hit's, so it is written in the loop,
-- with none of the tables below that find a key named again, and the reply is the MGET
-- table itself, each read replaced by its debt. The arithmetic is the loop's below, with
-- the set's own terms computed once (`limit`: the most debt an admitted hit may find), and
-- a missing key, the usual one among many users, skips it: debt 0 and, when it records,
-- the TAT `fresh`. Numbers come from strings by arithmetic (`+ 0`), not tonumber, and the
-- last written TAT's strings are kept in locals, not in `decimal`'s table.
-- benches/lua_instructions.sh, 2,000 calls of 16 keys among 1,000,000: 25,891
-- instructions a hit through the loop below, 20,076 through this one (20,121 for
-- redis-cell's CL.THROTTLE in the same run); a local function for the two writes cost 543
-- a hit more, so they are written out twice.
if ARGV[1] == '0' then
  local call, tonumber = redis.call, tonumber
  local cost, recording, interval = ARGV[2] + 0, ARGV[3], ARGV[4] + 0
  local tau, inc = ARGV[5] * interval, cost * interval
  local cap, limit = now + tau + ARGV[6], tau - inc
  local records, always = recording ~= '2' and inc <= tau, recording == '1'
  -- A missing key: debt 0, recorded as now + inc (at most cap), written when later than now
  -- and deleted otherwise (MGET reads a key of another type as missing, and the general
  -- loop deletes it then).
  local fresh = now + inc
  if fresh > cap then fresh = cap end
  local records_fresh = records and (always or 0 <= limit)
  local writes, deletes = records_fresh and fresh > now, records_fresh and fresh <= now
  local read = call('MGET', unpack(KEYS))
  local last, text, ms
  for i = 1, #KEYS do
    local tat = read[i]
    if tat then
      tat = tonumber(tat) or 0
      local from = tat
      if from < now then from = now end
      local debt = from - now
      if records and (always or debt <= limit) then
        local recorded = from + inc
        if recorded > cap then recorded = cap end
        if recorded < tat then recorded = tat end
        if recorded <= now then
          call('DEL', KEYS[i])
        else
          if recorded ~= last then
            local left = recorded - now + 999
            last, text, ms = recorded, format('%d', recorded), format('%d', (left - left % 1000) / 1000)
          end
          call('PSETEX', KEYS[i], ms, text)
        end
      end
      read[i] = debt
    else
      if deletes then
        call('DEL', KEYS[i])
      elseif writes then
        if fresh ~= last then
          local left = fresh - now + 999
          last, text, ms = fresh, format('%d', fresh), format('%d', (left - left % 1000) / 1000)
        end
        call('PSETEX', KEYS[i], ms, text)
      end
      read[i] = 0
    end
  end
  return read
end
local sets = tonumber(ARGV[1])
-- Keyed by the set's number as its hits name it (a string), so a hit finds its set without
-- reading a number from a string.
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
local debts = {}
-- Every key read in one command (one call into Redis instead of one per hit); a key named
-- again later in the batch reads what the hits before it recorded (`written`: each recorded
-- key's latest TAT; `order`: those keys, each once).
local read = redis.call('MGET', unpack(KEYS))
local written, order = {}, {}
for i = 1, hits do
  local p = only or params[ARGV[first + i]]
  local cost, recording, interval, burst, window = p[1], p[2], p[3], p[4], p[5]
  local key = one or KEYS[i]
  local tat = written[key]
  if tat == nil then
    -- A missing key (false) is a fresh one, without a call to tonumber.
    local value = read[one and 1 or i]
    tat = value and tonumber(value) or 0
  end
  local tau = burst * interval
  local inc = cost * interval
  -- gcra.verdict: the debt is max(tat, now) - now.
  local from = tat
  if from < now then from = now end
  local debt = from - now
  -- Admitted hits are recorded unless recording is `never`; denied ones only when it is
  -- `always`, and never a cost above the capacity.
  if recording ~= 2 and inc <= tau and (recording == 1 or debt <= tau - inc) then
    -- gcra.record (the recorded TAT is later than now: inc > 0 or debt > 0, or it equals
    -- now and the key is deleted below).
    -- max(min(max(tat, now) + inc, now + tau + window), tat)
    local recorded, cap = from + inc, now + tau + window
    if recorded > cap then recorded = cap end
    if recorded < tat then recorded = tat end
    if written[key] == nil then order[#order + 1] = key end
    written[key] = recorded
  end
  debts[i] = debt
end
-- gcra.save, once per key: the final TAT with its expiry in the same command, or the key
-- deleted when that TAT is not later than now.
-- Both numbers go as decimal strings (`decimal`, decimal.lua): a fresh key's TAT, now + its
-- cost, is most fresh keys' TAT. On 1,000,000 keys Redis spent 8% fewer instructions per hit
-- (benches/lua_instructions.sh).
for j = 1, #order do
  local key = order[j]
  local recorded = written[key]
  if recorded <= now then
    redis.call('DEL', key)
  else
    -- floor((recorded - now + 999) / 1000) milliseconds: at least 1, as recorded > now.
    local left = recorded - now + 999
    local ms = decimal((left - left % 1000) / 1000)
    redis.call('PSETEX', key, ms, decimal(recorded))
  end
end
return debts

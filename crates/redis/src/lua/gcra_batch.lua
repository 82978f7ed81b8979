-- sluice: the lean script for the common hit, one GCRA leaf and no penalty, for a batch of
-- such hits decided one after the other in one call (each its own decision, in order: a key
-- named twice sees the first hit's write).
--
-- The same writes as algorithms.lua's `run` for that shape (gcra.verdict, gcra.record,
-- gcra.save), line for line, checked against the same vectors, without the library: no
-- function or table built per call but the reply, no rule tree, one `SET ... PX` per write.
-- `now` (integer microseconds) is defined by the entry before this text (redis_now.lua, or
-- the tests' `now`).
--
-- KEYS: one per hit, the leaf's key, state "<tat>". ARGV: the number of parameter sets S,
-- then S sets of five (cost, recording (0 admitted, 1 always, 2 never), interval, burst,
-- window in ticks), then one per hit, in KEYS' order: the number of its set (from 1). Hits
-- of one policy share a set, so a batch's arguments are mostly one small number per hit.
-- Reply: one integer per hit, its debt before the hit (max(tat, now) - now). The store turns
-- it into the decision with the core's GCRA (the verdict depends on `now` and the TAT only
-- through it), so the reply costs one integer, not a table of seven.
--
-- The expiry divides with math.floor(a / b) where algorithms.lua uses floordiv: for integers
-- 0 <= a < 2^53 and b >= 1 the double quotient never rounds up to the next integer (it would
-- take an error of 1/b, and the error is at most a/b * 2^-53), so the two agree here.

local sets = tonumber(ARGV[1])
local params = {}
for s = 1, sets do
  local at = 1 + (s - 1) * 5
  params[s] = { tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]),
    tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]) }
end
local first = 1 + sets * 5
local debts = {}
-- Every key read in one command (one call into Redis instead of one per hit); a key named
-- again later in the batch reads what this call wrote to it (`written`, false once deleted).
local read = redis.call('MGET', unpack(KEYS))
local written = {}
for i = 1, #KEYS do
  local p = params[tonumber(ARGV[first + i])]
  local cost, recording, interval, burst, window = p[1], p[2], p[3], p[4], p[5]
  local stored = written[KEYS[i]]
  if stored == nil then stored = read[i] end
  local tat = tonumber(stored) or 0
  local tau = burst * interval
  local inc = cost * interval
  -- gcra.verdict
  local debt = math.max(tat, now) - now
  -- Admitted hits are recorded unless recording is `never`; denied ones only when it is
  -- `always`, and never a cost above the capacity.
  if recording ~= 2 and inc <= tau and (recording == 1 or debt <= tau - inc) then
    -- gcra.record and gcra.save (the recorded TAT is later than now: inc > 0 or debt > 0,
    -- or it equals now and the key is deleted), with the expiry in the same command.
    local recorded = math.max(math.min(math.max(tat, now) + inc, now + tau + window), tat)
    if recorded <= now then
      redis.call('DEL', KEYS[i])
      written[KEYS[i]] = false
    else
      local text = string.format('%d', recorded)
      redis.call('SET', KEYS[i], text, 'PX',
        math.max(math.floor((recorded - now + 999) / 1000), 1))
      written[KEYS[i]] = text
    end
  end
  debts[i] = debt
end
return debts

-- sluice: the lean script for the common hit, one GCRA leaf and no penalty.
--
-- The same decision as algorithms.lua's `run` for that shape (gcra.verdict, gcra.record,
-- gcra.save and the fold of a single leaf), line for line, checked against the same vectors,
-- without the library: no function or table built per call but the reply, no rule tree, one
-- `SET ... PX`. `now` (integer microseconds) is defined by the entry before this text
-- (redis_now.lua, or the tests' `now`).
--
-- KEYS: the leaf's key, state "<tat>". ARGV: cost, recording (0 admitted, 1 always, 2 never),
-- interval, burst, window (ticks). Reply as `run`'s:
-- {allowed, limit, remaining, reset_after, retry_after (-1 none), denial, leaf}.
--
-- Divisions use math.floor(a / b) where algorithms.lua uses floordiv: for integers
-- 0 <= a < 2^53 and b >= 1 the double quotient never rounds up to the next integer (it would
-- take an error of 1/b, and the error is at most a/b * 2^-53), so the two agree here.

local cost, recording = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval, burst, window = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tat = tonumber(redis.call('GET', KEYS[1])) or 0
local tau = burst * interval
local inc = cost * interval

-- gcra.verdict
local debt = math.max(tat, now) - now
if inc <= tau and debt <= tau - inc then
  if recording ~= 2 then
    -- gcra.record and gcra.save (the recorded TAT is later than now: inc > 0 or debt > 0,
    -- or it equals now and the key is deleted), with the expiry in the same command.
    local recorded = math.max(math.min(math.max(tat, now) + inc, now + tau + window), tat)
    if recorded <= now then
      redis.call('DEL', KEYS[1])
    else
      redis.call('SET', KEYS[1], string.format('%d', recorded), 'PX',
        math.max(math.floor((recorded - now + 999) / 1000), 1))
    end
  end
  return { 1, burst, math.floor((tau - debt - inc) / interval), debt + inc, -1, 0, 0 }
end
local remaining = math.floor(math.max(tau - debt, 0) / interval)
if inc > tau then
  -- Never admitted: not counted even when denials are.
  return { 0, burst, remaining, debt, -1, 2, 0 }
end
local retry = tat + inc - tau - now
if recording == 1 then
  -- gcra.record: a counted denial lengthens the wait, so the recorded state's verdict
  -- (still a denial: its debt only grew) is the answer.
  local recorded = math.max(math.min(math.max(tat, now) + inc, now + tau + window), tat)
  debt = math.max(recorded, now) - now
  remaining = math.floor(math.max(tau - debt, 0) / interval)
  retry = recorded + inc - tau - now
  if recorded <= now then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], string.format('%d', recorded), 'PX',
      math.max(math.floor((recorded - now + 999) / 1000), 1))
  end
end
return { 0, burst, remaining, debt, retry, 1, 0 }

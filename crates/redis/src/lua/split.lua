-- Entry point for a rule whose keys fall in several cluster slots: one call per slot.
--
-- ARGV: mode, cost, token, leaf count, then seven numbers per leaf (its index in the rule and
-- the six quota numbers of `run`), then for `reserve` of an acquire the lease id, for `undo`
-- the reservation time (and the lease id of an acquire), and for penalty modes base,
-- factor, max, forget_after. KEYS: the leaves' keys (or the penalty record).
--
--   reserve  judge each leaf; record the hit where the leaf admits it (a reservation); with
--            a lease id, a concurrency leaf drops its expired leases first and holds the
--            lease where it admits.
--   judge    the same without reserving (a peek).
--            Returns now, then per leaf: allowed, limit, remaining, reset_after, retry, reserved.
--   commit   record the hit in every leaf given (admitted `and`, counted denials).
--   undo     take back reservations made at the given time.
--   pcheck   ticks left in the penalty box (0 if none).
--   pstrike  add a strike; returns the wait.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local mode, cost, token, count = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])

if mode == 'pcheck' or mode == 'pstrike' then
  local penalty = { base = tonumber(ARGV[5]), factor = tonumber(ARGV[6]),
                    max = tonumber(ARGV[7]), forget = tonumber(ARGV[8]) }
  local rec = penalty_load(KEYS[1])
  if mode == 'pcheck' then return math.max(rec['until'] - now, 0) end
  local wait = penalty_strike(penalty, rec, now)
  penalty_save(KEYS[1], penalty, rec, now)
  return wait
end

local leaves = {}
for i = 1, count do
  local at = 5 + (i - 1) * 7
  local q = { alg = tonumber(ARGV[at + 1]), limit = tonumber(ARGV[at + 2]), window = tonumber(ARGV[at + 3]),
              interval = tonumber(ARGV[at + 4]), burst = tonumber(ARGV[at + 5]), windows = tonumber(ARGV[at + 6]) }
  q.sub = ceildiv(q.window, q.windows)
  leaves[i] = { index = tonumber(ARGV[at]), q = q, key = KEYS[i] }
end

if mode == 'reserve' or mode == 'judge' then
  local out = { now }
  local lease = ARGV[5 + count * 7]
  for _, leaf in ipairs(leaves) do
    local algo = ALGORITHMS[leaf.q.alg]
    local st = algo.load(leaf.key, leaf.q)
    if lease and algo.drop then algo.drop(leaf.key, now) end
    local v = algo.verdict(leaf.q, st, now, cost)
    local reserved = 0
    if v.allowed and cost > 0 and mode == 'reserve' then
      algo.record(leaf.q, st, now, cost, token, leaf.index)
      if lease and algo.hold then algo.hold(leaf.q, leaf.key, now, lease) end
      algo.save(leaf.key, leaf.q, st, now)
      reserved = 1
    end
    local allowed = 0
    if v.allowed then allowed = 1 end
    for _, n in ipairs({ allowed, v.limit, v.remaining, v.reset_after, v.retry, reserved }) do
      out[#out + 1] = n
    end
  end
  return out
elseif mode == 'commit' then
  for _, leaf in ipairs(leaves) do
    local algo = ALGORITHMS[leaf.q.alg]
    local st = algo.load(leaf.key, leaf.q)
    algo.record(leaf.q, st, now, cost, token, leaf.index)
    algo.save(leaf.key, leaf.q, st, now)
  end
  return now
elseif mode == 'undo' then
  local at = tonumber(ARGV[5 + count * 7])
  for _, leaf in ipairs(leaves) do
    local q, key = leaf.q, leaf.key
    if q.alg == CONCURRENCY then
      local lease = ARGV[6 + count * 7]
      if lease then
        leases.load(key)
        redis.call('ZREM', key, lease)
      end
    elseif q.alg == GCRA then
      local st = gcra.load(key)
      st.tat = st.tat - cost * q.interval
      gcra.save(key, q, st, now)
    elseif q.alg == FIXED_WINDOW then
      local st = fixed.load(key)
      if st.window == floordiv(at, q.window) then st.count = math.max(st.count - cost, 0) end
      fixed.save(key, q, st, now)
    elseif q.alg == SLIDING_WINDOW then
      local st = sliding.load(key, q)
      local n = floordiv(at, q.sub)
      if n <= st.newest and n + q.windows > st.newest then
        st.counts[n % q.windows] = math.max(st.counts[n % q.windows] - cost, 0)
      end
      sliding.save(key, q, st, now)
    else
      local stamp = string.format('%d', at)
      for n = 1, math.min(cost, q.limit) do
        redis.call('ZREM', key, stamp .. ':' .. token .. ':' .. leaf.index .. ':' .. n)
      end
    end
  end
  return now
end
return redis.error_reply('sluice: unknown mode ' .. tostring(mode))

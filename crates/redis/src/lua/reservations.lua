-- sluice: reservations, appended to algorithms.lua and leases.lua. `reserve` decides a hit as
-- `run` does and answers the time of the step too; `settle` charges a reservation its actual
-- cost, a line-for-line translation of crates/core/src/algorithm/settle.rs. Never refused.

-- `run`'s reply followed by `now`, which `settle` needs back as the reservation's time.
local function reserve(now)
  local reply = run(now)
  reply[#reply + 1] = now
  return reply
end

-- ARGV: taken_at (the time `reserve` answered), reserved, actual, token, leaf count, then
-- seven numbers per leaf (its index in the rule, then `run`'s six quota numbers). KEYS: the
-- leaves' keys. Returns how many leaves changed.
local function settle(now)
  local taken_at, reserved, actual = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local token, count = ARGV[4], tonumber(ARGV[5])
  if actual == reserved then return 0 end
  local refund, debt = math.max(reserved - actual, 0), math.max(actual - reserved, 0)
  local changed = 0
  for i = 1, count do
    local at = 6 + (i - 1) * 7
    local index = ARGV[at]
    local q = { alg = tonumber(ARGV[at + 1]), limit = tonumber(ARGV[at + 2]), window = tonumber(ARGV[at + 3]),
                interval = tonumber(ARGV[at + 4]), burst = tonumber(ARGV[at + 5]), windows = tonumber(ARGV[at + 6]) }
    q.sub = ceildiv(q.window, q.windows)
    local key = KEYS[i]
    if q.alg == GCRA then
      -- A refund moves the TAT back, a debt forward from max(TAT, now).
      local st = gcra.load(key)
      local before = st.tat
      if refund > 0 then
        st.tat = math.max(st.tat - refund * q.interval, 0)
      else
        st.tat = math.max(st.tat, now) + debt * q.interval
      end
      if st.tat ~= before then
        gcra.save(key, q, st, now)
        changed = changed + 1
      end
    elseif q.alg == FIXED_WINDOW then
      -- The counter of the reservation's window, while it is still the one counted.
      local st = fixed.load(key)
      local taken = floordiv(taken_at, q.window)
      if st.window == taken and floordiv(now, q.window) == taken then
        st.count = math.max(st.count - refund, 0) + debt
        fixed.save(key, q, st, now)
        changed = changed + 1
      end
    elseif q.alg == SLIDING_WINDOW then
      -- The counter of the reservation's sub-window, while it is one of those counted.
      local st = sliding.load(key, q)
      local number = floordiv(taken_at, q.sub)
      local counted = number + q.windows > floordiv(now, q.sub)
      if counted and number <= st.newest and number + q.windows > st.newest then
        local slot = number % q.windows
        st.counts[slot] = math.max(st.counts[slot] - refund, 0) + debt
        sliding.save(key, q, st, now)
        changed = changed + 1
      end
    elseif q.alg == SLIDING_LOG then
      -- The units logged at taken_at, while they are in the log: a refund removes some, a
      -- debt adds more at the same time (at most `limit`: more could not deny longer).
      local when = stamp(taken_at)
      local units = redis.call('ZRANGEBYSCORE', key, when, when)
      if taken_at + q.window > now and #units > 0 then
        if refund > 0 then
          for n = 1, math.min(refund, #units) do redis.call('ZREM', key, units[n]) end
        else
          local args = {}
          for n = 1, math.min(debt, q.limit) do
            args[#args + 1] = when
            args[#args + 1] = when .. ':' .. token .. ':s' .. index .. ':' .. n
            if #args >= 2000 then
              redis.call('ZADD', key, unpack(args))
              args = {}
            end
          end
          if #args > 0 then redis.call('ZADD', key, unpack(args)) end
        end
        log.save(key, q, nil, now)
        changed = changed + 1
      end
    end
    -- Concurrency: nothing (a reservation holds no lease).
  end
  return changed
end

-- sluice: the rate-limiting algorithms and the rule-tree evaluation, in Lua.
--
-- A line-for-line translation of sluice-core (crates/core/src/algorithm/*.rs and
-- evaluate.rs), checked against the same vectors. Times are integer microseconds ("ticks"):
-- Lua numbers are doubles, exact below 2^53, and every time and duration here stays far
-- below that (now ~ 1.8e15 us; windows and buckets are bounded by the quota's validation).
--
-- State layouts (one Redis key per leaf identifier, each with an expiry):
--   gcra            string  "<tat>"                 theoretical arrival time
--   fixed-window    string  "<window>:<count>"      window number (now // span) and count
--   sliding-window  string  msgpack [newest, c_0 .. c_{G-1}]  counts by sub-window mod G
--   sliding-log     zset    one member per unit of cost, scored by its time:
--                           "<time>:<token>:<leaf>:<n>"
--   penalty         string  "<strikes>:<until>:<last_strike>"
--   concurrency     zset    lease id -> expiry (see leases.lua, appended to this file)

local NOW, NEVER = -1, -2          -- retry codes; any value >= 0 is "after that many ticks"
local GCRA, SLIDING_WINDOW, SLIDING_LOG, FIXED_WINDOW = 1, 2, 3, 4
local DENIAL_NONE, DENIAL_LIMITED, DENIAL_NEVER, DENIAL_PENALIZED = 0, 1, 2, 3

-- Exact integer division of doubles that hold integers below 2^53.
local function floordiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceildiv(a, b)
  return floordiv(a + b - 1, b)
end

local function expire(key, expires_at, now)
  local ms = ceildiv(expires_at - now, 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, ms)
end

-- GCRA ----------------------------------------------------------------------------------

local gcra = {}

function gcra.load(key)
  return { tat = tonumber(redis.call('GET', key)) or 0 }
end

function gcra.verdict(q, st, now, cost)
  local tau = q.burst * q.interval
  local base = math.max(st.tat, now)
  local debt = base - now
  local inc = cost * q.interval
  local remaining_before = floordiv(math.max(tau - debt, 0), q.interval)
  if inc <= tau and debt <= tau - inc then
    return { allowed = true, limit = q.burst, remaining = floordiv(tau - debt - inc, q.interval),
             reset_after = debt + inc, retry = NOW }
  elseif inc <= tau then
    return { allowed = false, limit = q.burst, remaining = remaining_before,
             reset_after = debt, retry = st.tat + inc - tau - now }
  end
  return { allowed = false, limit = q.burst, remaining = remaining_before,
           reset_after = debt, retry = NEVER }
end

function gcra.record(q, st, now, cost)
  local tau = q.burst * q.interval
  local ceiling = now + tau + q.window
  st.tat = math.max(math.min(math.max(st.tat, now) + cost * q.interval, ceiling), st.tat)
end

function gcra.save(key, q, st, now)
  if st.tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%d', st.tat))
    expire(key, st.tat, now)
  end
end

-- Fixed window ----------------------------------------------------------------------------

local fixed = {}

function fixed.load(key)
  local raw = redis.call('GET', key)
  if raw then
    local w, c = string.match(raw, '^(%d+):(%d+)$')
    if w then return { window = tonumber(w), count = tonumber(c) } end
  end
  return { window = 0, count = 0 }
end

function fixed.verdict(q, st, now, cost)
  local current = floordiv(now, q.window)
  local used = 0
  if st.window == current then used = st.count end
  local window_end = (current + 1) * q.window
  local total = used + cost
  if total <= q.limit then
    local reset = 0
    if total > 0 then reset = window_end - now end
    return { allowed = true, limit = q.limit, remaining = q.limit - total, reset_after = reset, retry = NOW }
  end
  local reset = 0
  if used > 0 then reset = window_end - now end
  local retry = window_end - now
  if cost > q.limit then retry = NEVER end
  return { allowed = false, limit = q.limit, remaining = math.max(q.limit - used, 0),
           reset_after = reset, retry = retry }
end

function fixed.record(q, st, now, cost)
  local current = floordiv(now, q.window)
  local used = 0
  if st.window == current then used = st.count end
  st.window = current
  st.count = math.min(used + cost, q.limit * 2)
end

function fixed.save(key, q, st, now)
  local expires_at = 0
  if st.count > 0 then expires_at = (st.window + 1) * q.window end
  if expires_at <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%d:%d', st.window, st.count))
    expire(key, expires_at, now)
  end
end

-- Sliding window counter ------------------------------------------------------------------

local sliding = {}

function sliding.load(key, q)
  local raw = redis.call('GET', key)
  if raw then
    local ok, packed = pcall(cmsgpack.unpack, raw)
    if ok and type(packed) == 'table' and #packed == q.windows + 1 then
      local counts = {}
      for i = 1, q.windows do counts[i - 1] = packed[i + 1] end
      return { newest = packed[1], counts = counts }
    end
  end
  local counts = {}
  for i = 0, q.windows - 1 do counts[i] = 0 end
  return { newest = 0, counts = counts }
end

-- Count of sub-window `number` as of the newest sub-window written.
local function sw_count(q, st, number)
  if number > st.newest or number + q.windows <= st.newest then return 0 end
  return st.counts[number % q.windows]
end

function sliding.verdict(q, st, now, cost)
  local sub, g = q.sub, q.windows
  local current = floordiv(now, sub)
  local oldest = math.max(current + 1 - g, 0)
  local used, last = 0, nil
  for n = oldest, current do
    local c = sw_count(q, st, n)
    used = used + c
    if c > 0 then last = n end
  end
  local total = used + cost
  if total <= q.limit then
    if cost > 0 then last = current end
    local reset_at = now
    if last then reset_at = (last + g) * sub end
    return { allowed = true, limit = q.limit, remaining = q.limit - total,
             reset_after = reset_at - now, retry = NOW }
  end
  local retry = NEVER
  if cost <= q.limit then
    local left, retry_at = used, now
    for n = oldest, current do
      if left + cost <= q.limit then break end
      local c = sw_count(q, st, n)
      if c > 0 then
        left = left - c
        retry_at = (n + g) * sub
      end
    end
    retry = retry_at - now
  end
  local reset_at = now
  if last then reset_at = (last + g) * sub end
  return { allowed = false, limit = q.limit, remaining = math.max(q.limit - used, 0),
           reset_after = reset_at - now, retry = retry }
end

function sliding.record(q, st, now, cost)
  local g = q.windows
  local current = floordiv(now, q.sub)
  if current > st.newest then
    local stale = math.min(current - st.newest, g)
    for n = current + 1 - stale, current do st.counts[n % g] = 0 end
    st.newest = current
  end
  local slot = st.newest % g
  st.counts[slot] = math.min(st.counts[slot] + cost, q.limit * 2)
end

function sliding.save(key, q, st, now)
  local g = q.windows
  local expires_at = 0
  for back = 0, g - 1 do
    local n = st.newest - back
    if n < 0 then break end
    if sw_count(q, st, n) > 0 then
      expires_at = (n + g) * q.sub
      break
    end
  end
  if expires_at <= now then
    redis.call('DEL', key)
    return
  end
  local packed = { st.newest }
  for i = 0, g - 1 do packed[i + 2] = st.counts[i] end
  redis.call('SET', key, cmsgpack.pack(packed))
  expire(key, expires_at, now)
end

-- Sliding log (a sorted set: its state lives in Redis, not in Lua) -----------------------

local log = {}

function log.load(key)
  return { key = key }
end

function log.verdict(q, st, now, cost)
  local after = '(' .. string.format('%d', now - q.window)
  local used = tonumber(redis.call('ZCOUNT', st.key, after, '+inf'))
  local newest = nil
  if used > 0 then
    local top = redis.call('ZRANGE', st.key, -1, -1, 'WITHSCORES')
    newest = tonumber(top[2])
  end
  local total = used + cost
  if total <= q.limit then
    local reset_at = now
    if cost > 0 then reset_at = now + q.window elseif newest then reset_at = newest + q.window end
    return { allowed = true, limit = q.limit, remaining = q.limit - total,
             reset_after = reset_at - now, retry = NOW }
  end
  local retry = NEVER
  if cost <= q.limit then
    -- The hit fits once the k oldest units have left the window.
    local k = used + cost - q.limit
    local kth = redis.call('ZRANGEBYSCORE', st.key, after, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    retry = tonumber(kth[2]) + q.window - now
  end
  local reset_at = now
  if newest then reset_at = newest + q.window end
  return { allowed = false, limit = q.limit, remaining = math.max(q.limit - used, 0),
           reset_after = reset_at - now, retry = retry }
end

function log.record(q, st, now, cost, token, leaf)
  redis.call('ZREMRANGEBYSCORE', st.key, '-inf', string.format('%d', now - q.window))
  local units = math.min(cost, q.limit)
  if units <= 0 then return end
  local stamp = string.format('%d', now)
  local args = {}
  for n = 1, units do
    args[#args + 1] = stamp
    args[#args + 1] = stamp .. ':' .. token .. ':' .. leaf .. ':' .. n
    if #args >= 2000 then
      redis.call('ZADD', st.key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZADD', st.key, unpack(args)) end
  -- A denied hit recorded anyway pushes the oldest units out: never more than `limit`.
  local card = tonumber(redis.call('ZCARD', st.key))
  if card > q.limit then
    redis.call('ZREMRANGEBYRANK', st.key, 0, card - q.limit - 1)
  end
end

function log.save(key, q, st, now)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then
    local expires_at = tonumber(top[2]) + q.window
    if expires_at <= now then redis.call('DEL', key) else expire(key, expires_at, now) end
  end
end

local ALGORITHMS = { [GCRA] = gcra, [SLIDING_WINDOW] = sliding, [SLIDING_LOG] = log, [FIXED_WINDOW] = fixed }

-- Penalties --------------------------------------------------------------------------------

local function penalty_load(key)
  local raw = redis.call('GET', key)
  if raw then
    local s, u, l = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if s then return { strikes = tonumber(s), ['until'] = tonumber(u), last = tonumber(l) } end
  end
  return { strikes = 0, ['until'] = 0, last = 0 }
end

local function penalty_strike(p, rec, now)
  if rec.strikes > 0 and now - rec.last >= p.forget then rec.strikes = 0 end
  rec.strikes = rec.strikes + 1
  local timeout = math.min(p.base * (p.factor ^ (rec.strikes - 1)), p.max)
  rec['until'] = now + timeout
  rec.last = now
  return timeout
end

local function penalty_save(key, p, rec, now)
  local expires_at = 0
  if rec.strikes > 0 then expires_at = math.max(rec['until'], rec.last + p.forget) end
  if expires_at <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%d:%d:%d', rec.strikes, rec['until'], rec.last))
    expire(key, expires_at, now)
  end
end

-- The rule tree ------------------------------------------------------------------------------

-- Parses the shape: prefix tokens "o<n>", "a<n>", "l<i>" (leaf indices from 0).
local function parse_shape(text)
  local tokens = {}
  for t in string.gmatch(text, '%S+') do tokens[#tokens + 1] = t end
  local at = 0
  local function node()
    at = at + 1
    local t = tokens[at]
    local kind, n = string.sub(t, 1, 1), tonumber(string.sub(t, 2))
    if kind == 'l' then return { leaf = n } end
    local children = {}
    for i = 1, n do children[i] = node() end
    return { kind = kind, children = children }
  end
  return node()
end

-- Whether retry `b` is strictly later than `a` (as `later` in evaluate.rs).
local function later(a, b)
  if a == NEVER then return false end
  if b == NEVER then return true end
  if a >= 0 and b >= 0 then return b > a end
  if a == NOW then return true end
  return false
end

local function fold(shape, verdicts)
  if shape.leaf then
    local v = verdicts[shape.leaf]
    return { reached = not v.allowed, retry = v.retry, retry_leaf = shape.leaf,
             remaining = v.remaining, remaining_leaf = shape.leaf }
  end
  local nodes = {}
  for i, child in ipairs(shape.children) do nodes[i] = fold(child, verdicts) end
  local first = nodes[1]
  local out = { reached = false, retry = NOW, retry_leaf = first.retry_leaf,
                remaining = first.remaining, remaining_leaf = first.remaining_leaf }
  if first.reached then out.retry = first.retry end
  if shape.kind == 'o' then
    for _, n in ipairs(nodes) do
      if n.reached then out.reached = true end
      if n.reached and (out.retry == NOW or later(out.retry, n.retry)) then
        out.retry, out.retry_leaf = n.retry, n.retry_leaf
      end
      if n.remaining < out.remaining then
        out.remaining, out.remaining_leaf = n.remaining, n.remaining_leaf
      end
    end
  else
    out.reached = true
    for _, n in ipairs(nodes) do
      if not n.reached then out.reached = false end
      if later(n.retry, out.retry) then
        out.retry, out.retry_leaf = n.retry, n.retry_leaf
      end
      if n.remaining > out.remaining then
        out.remaining, out.remaining_leaf = n.remaining, n.remaining_leaf
      end
    end
  end
  return out
end

-- A decision: {allowed, limit, remaining, reset_after, retry_after (-1 none), denial, leaf}.
local function decide(shape, quotas, states, now, cost)
  local verdicts = {}
  for i = 0, #quotas do
    local q = quotas[i]
    verdicts[i] = ALGORITHMS[q.alg].verdict(q, states[i], now, cost)
  end
  local root = fold(shape, verdicts)
  if root.reached then
    local v = verdicts[root.retry_leaf]
    local retry, denial = root.retry, DENIAL_LIMITED
    if retry == NEVER then retry, denial = -1, DENIAL_NEVER end
    return { allowed = false, limit = v.limit, remaining = root.remaining,
             reset_after = v.reset_after, retry_after = retry, denial = denial, leaf = root.retry_leaf }
  end
  local v = verdicts[root.remaining_leaf]
  return { allowed = true, limit = v.limit, remaining = root.remaining, reset_after = v.reset_after,
           retry_after = -1, denial = DENIAL_NONE, leaf = root.remaining_leaf }
end

-- Reads the request (KEYS, ARGV) and decides it at `now`, atomically. With `lease` (a lease
-- id, from `acquire` in leases.lua), the concurrency leaves drop their expired leases first
-- and, when the rule admits the hit, each holds the lease.
--
-- ARGV: cost, recording (0 admitted, 1 always, 2 never), shape, token, leaf count, then six
-- numbers per leaf (algorithm, limit, window, interval, burst, windows), then, when KEYS holds
-- one more key than there are leaves (the penalty record), base, factor, max, forget_after.
local function run(now, lease)
  local cost, recording = tonumber(ARGV[1]), tonumber(ARGV[2])
  local shape, token, count = parse_shape(ARGV[3]), ARGV[4], tonumber(ARGV[5])
  local quotas, states = {}, {}
  for i = 0, count - 1 do
    local at = 6 + i * 6
    local q = { alg = tonumber(ARGV[at]), limit = tonumber(ARGV[at + 1]), window = tonumber(ARGV[at + 2]),
                interval = tonumber(ARGV[at + 3]), burst = tonumber(ARGV[at + 4]), windows = tonumber(ARGV[at + 5]) }
    q.sub = ceildiv(q.window, q.windows)
    quotas[i] = q
    states[i] = ALGORITHMS[q.alg].load(KEYS[i + 1], q)
    if lease and ALGORITHMS[q.alg].drop then ALGORITHMS[q.alg].drop(KEYS[i + 1], now) end
  end
  local penalty, record_p = nil, nil
  if #KEYS > count then
    local at = 6 + count * 6
    penalty = { base = tonumber(ARGV[at]), factor = tonumber(ARGV[at + 1]),
                max = tonumber(ARGV[at + 2]), forget = tonumber(ARGV[at + 3]) }
    record_p = penalty_load(KEYS[count + 1])
    if record_p['until'] > now then
      local wait = record_p['until'] - now
      local v = ALGORITHMS[quotas[0].alg].verdict(quotas[0], states[0], now, 0)
      return { 0, v.limit, 0, math.max(v.reset_after, wait), wait, DENIAL_PENALIZED, 0 }
    end
  end

  local d = decide(shape, quotas, states, now, cost)
  local record = (recording == 0 and d.allowed)
    or (recording == 1 and d.denial ~= DENIAL_NEVER)
  if record then
    for i = 0, count - 1 do
      ALGORITHMS[quotas[i].alg].record(quotas[i], states[i], now, cost, token, i)
    end
    if not d.allowed then
      -- A counted denial lengthens the wait: report the recorded states' wait.
      local after = decide(shape, quotas, states, now, cost)
      if not after.allowed then d = after end
    end
    for i = 0, count - 1 do
      ALGORITHMS[quotas[i].alg].save(KEYS[i + 1], quotas[i], states[i], now)
    end
  end
  if lease and d.allowed then
    for i = 0, count - 1 do
      local algo = ALGORITHMS[quotas[i].alg]
      if algo.hold then
        algo.hold(quotas[i], KEYS[i + 1], now, lease)
        algo.save(KEYS[i + 1], quotas[i], states[i], now)
      end
    end
  end
  if penalty and d.denial == DENIAL_LIMITED and recording ~= 2 then
    local wait = penalty_strike(penalty, record_p, now)
    if d.retry_after < 0 or d.retry_after < wait then
      d.retry_after = wait
      d.reset_after = math.max(d.reset_after, wait)
      d.denial = DENIAL_PENALIZED
    end
    penalty_save(KEYS[count + 1], penalty, record_p, now)
  end
  local allowed = 0
  if d.allowed then allowed = 1 end
  return { allowed, d.limit, d.remaining, d.reset_after, d.retry_after, d.denial, d.leaf }
end

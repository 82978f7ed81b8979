-- sluice: the lean script for a rule of GCRA, fixed-window, sliding-window and sliding-log
-- leaves joined by `;` (`or`: the hit is denied when any leaf would be exceeded), or of one
-- such leaf (a GCRA leaf alone without a penalty has gcra_batch.lua, and so on), or of any
-- tree of `or` and `and` over such leaves (`and(apikey:100/h, 10/s)`), with or without a
-- penalty, for a batch of such hits decided one after the other in one call (each its own
-- decision, in order: a key named by several hits, such as a limit every caller shares or
-- a penalty record, sees the earlier hits' writes), as gcra_batch.lua does for one leaf
-- without a penalty.
--
-- The same writes as algorithms.lua's `run` for that shape (penalty_load and its early
-- answer, each leaf's algorithm's verdict, the fold's verdict, each leaf's record and save,
-- penalty_strike and penalty_save), line for line, without the library. A key named by
-- several hits of the batch is written once, after the last of them. `now` (integer
-- microseconds) is defined by the entry before this text (redis_now.lua, or the tests'
-- `now`), `decimal` by decimal.lua.
--
-- KEYS: each hit's leaves' keys in the rule's leaf order, then its penalty record's key if
-- it has a penalty, hit after hit. ARGV: the number of parameter sets S, then S sets, each:
-- cost, recording (0 admitted, 1 always, 2 never), the number of leaves L, L quadruples
-- (1, interval, burst, window in ticks for a GCRA leaf; 4, limit, window length in ticks, 0
-- for a fixed window; 2, limit, sub-window length in ticks, sub-windows G for a sliding
-- window; 3, limit, window in ticks, 0 for a sliding log: algorithms.lua's codes), then the
-- shape: 0 for one leaf or an `or` of every leaf, else its length K and K numbers, the tree
-- in prefix order (leaf j is j, an `or` of n children 100 + n, an `and` of n children
-- 200 + n); then 0 (no penalty) or 1 and
-- the penalty's base, factor, max and forget_after (ticks); then one per hit, in order: the
-- number of its set (from 1), left out when S is 1. Last, a token unique to the call, for
-- the sliding logs' members (as in log_batch.lua: "<time>:<token>:<n>").
-- Reply: `now`, then per hit: for each leaf, a GCRA leaf's debt before the hit
-- (max(tat, now) - now), a fixed window's count before the hit in the current window, a
-- sliding window's six integers or a sliding log's four (below), and with a penalty the
-- record the hit found (strikes, until, last strike). The store turns them into the
-- decision with the core's rule evaluation at `now`.
--
-- A sliding window answers what a decision on it reads, with k = used + cost - limit and
-- k2 the same once the hit is recorded: the units counted at now (`used`), those of the
-- current sub-window, and, as sub-windows back from the current one (0: none, or in the
-- current one), the newest earlier sub-window holding units, the one where the k-th oldest
-- unit lies (a denial's wait: asked when the cost fits the limit) and, with recording
-- `always`, the k2-th's (the recorded window's wait); then how many sub-windows after the
-- current one the state's newest is (Redis's clock stepped back: the hit is recorded there,
-- uncounted), else 0. (The state itself is G + 1 integers: a reply of a fine window's state,
-- up to 3,601 a leaf, cost the store's client more than the decision.) The store rebuilds a
-- window of at most four non-zero sub-windows that decides and records the same
-- (rule_batch.rs).
--
-- A sliding log is kept in Redis as log_batch.lua keeps it (a sorted set, one member per
-- unit of cost, written as the batch goes), too large to answer whole. It answers what a
-- decision on it can read: the units in its window as the hit found them (`used`), the
-- newest one's time (0 when `used` is 0), the time of the k-th oldest, k = used + cost -
-- limit (the wait of a denial: 0 when k < 1 or the cost exceeds the limit), and, when the
-- hit is recorded even if denied (recording `always`), the time of the (k + cost)-th oldest
-- (0 when there is none: what the recorded log's wait reads, as the k oldest are cut and
-- cost units of `now` are added). The store rebuilds a log that answers the same and
-- records the same (rule_batch.rs). That last time is read before the hit writes, so where
-- Redis's clock stepped back behind a log's newest member (the new units then sort among
-- the old), a counted denial's wait can differ from the full script's, by at most how far
-- the clock stepped back; what is admitted and what is written never differ.
--
-- Recording: the `or` is reached when any leaf is, so the hit is admitted when every leaf
-- admits it. Its wait is never when some leaf's cost exceeds its capacity (its burst, or a
-- window's limit: such a leaf is always reached, and `or` waits for its latest reached
-- leaf); otherwise a denial is limited. A tree folds the same way: an `or` is
-- reached when any child is and waits never when any child does; an `and` is reached only
-- when every child is and waits never only when every child does. A denial is recorded
-- (recording `always`) unless its wait is never; a limited one adds a strike to the
-- penalty record unless recording is `never`. A hit that finds its key boxed by the
-- penalty (`until` later than now) is denied and changes nothing.
-- Arithmetic as in gcra_batch.lua: no library function per hit, but cmsgpack's once per
-- sliding-window key read and once per such key written.

local format = string.format
local sets = tonumber(ARGV[1])
-- Keyed by the set's number as its hits name it (a string). A set: cost, recording, L,
-- the L quadruples (leaf j's at 4j .. 4j + 3), then 1 and the penalty's four numbers, or 0;
-- `tree`, the shape's K numbers, when it is not one leaf or an `or` of every leaf.
local params = {}
local at = 2
for s = 1, sets do
  local leaves = tonumber(ARGV[at + 2])
  if leaves == nil or leaves < 1 then return redis.error_reply('a parameter set without leaves') end
  local p = { tonumber(ARGV[at]), tonumber(ARGV[at + 1]), leaves }
  for j = 1, 4 * leaves do p[3 + j] = tonumber(ARGV[at + 2 + j]) end
  local after = at + 3 + 4 * leaves
  local k = tonumber(ARGV[after])
  if k > 0 then
    p.tree = {}
    for j = 1, k do p.tree[j] = tonumber(ARGV[after + j]) end
  end
  after = after + 1 + k
  if ARGV[after] == '1' then
    p.penalty = { tonumber(ARGV[after + 1]), tonumber(ARGV[after + 2]),
      tonumber(ARGV[after + 3]), tonumber(ARGV[after + 4]) }
    at = after + 5
  else
    at = after + 1
  end
  params[format('%d', s)] = p
end
local first = at - 1
local only = nil
if sets == 1 then only = params['1'] end

-- The fold of the subtree at `tree[pos]` over this hit's leaves (`reached`, `never`): where
-- the next subtree starts, whether it is reached, and whether its wait is never.
local function fold(tree, pos, reached, never)
  local t = tree[pos]
  if t < 100 then return pos + 1, reached[t], never[t] end
  local all = t > 200
  local r, n = all, all
  pos = pos + 1
  for _ = 1, t % 100 do
    local cr, cn
    pos, cr, cn = fold(tree, pos, reached, never)
    if all then
      r, n = r and cr, n and cn
    else
      r, n = r or cr, n or cn
    end
  end
  return pos, r, n
end

-- The reply, and how many integers it holds (counted: `#out` searches the table).
local out, size = { now }, 1
-- Every key read in one command; a key named again later in the batch reads what the hits
-- before it recorded (`written`: each recorded GCRA key's latest TAT; `order`: those keys,
-- each once; `windows`, `counts`, `lengths` and `fixed` the same for fixed windows).
-- Penalty records: `records` (each read or struck record, {strikes, until, last}),
-- `struck` (each struck record's forget_after), `strikes` (those keys, each once).
-- KEYS is a global: a local reads it without a lookup by name.
local keys, nkeys = KEYS, #KEYS
local read = redis.call('MGET', unpack(keys))
local written, order = {}, {}
local windows, counts, lengths, fixed = {}, {}, {}, {}
-- Sliding windows, as in sliding_batch.lua: each key's state once read or recorded
-- (`states`, the msgpack array itself, with its G in `gs`), and each recorded key once in
-- `slid`, with its sub-window length in `subs`.
local states, gs, subs, slid = {}, {}, {}, {}
-- Zeros to build a fresh sliding-window state from in one step.
local zeros = {}
local function fresh(g)
  for j = #zeros + 1, g + 1 do zeros[j] = 0 end
  return { unpack(zeros, 1, g + 1) }
end
-- Sliding logs, as in log_batch.lua: what the call knows of each key (`known`), for the
-- window it was read for: { window, its units in the window, its newest time or nil,
-- whether its expired members are gone, the times of its k-th oldest units asked since it
-- last changed (by k), the window of its last recording or nil }; each recorded key once
-- in `logs`. `serial` counts the call's members; `stamp` (now as text) and `token` are
-- made at the first record. (One table for all of it: a call of other leaves pays for
-- none of it but that.)
local known, logs = {}, nil
local serial, stamp, token = 0, nil, nil
-- The time of the k-th oldest unit in the window of `key`'s log, known as `log` (asked
-- once per k until the log changes: a flood of denials costs one read).
local function kth_time(key, log, k)
  local at = log[5][k]
  if at == nil then
    at = tonumber(redis.call('ZRANGEBYSCORE', key, '(' .. format('%d', now - log[1]), '+inf',
      'WITHSCORES', 'LIMIT', k - 1, 1)[2])
    log[5][k] = at
  end
  return at
end
local records, struck, strikes = {}, {}, {}
-- Where this hit's keys start in KEYS (less one).
local base, hit = 0, 0
-- This hit's leaves: a GCRA leaf's TAT, a fixed window's count before it, a sliding
-- window's state; a window's current number.
local tats, currents = {}, {}
-- With a tree: whether each leaf is reached, and whether its wait is never.
local reached, never = {}, {}
while base < nkeys do
  hit = hit + 1
  local p = only or params[ARGV[first + hit]]
  local cost, recording, leaves, penalty, tree = p[1], p[2], p[3], p.penalty, p.tree
  -- penalty_load, and the early answer of a boxed key: nothing recorded.
  local pkey, rec = nil, nil
  local boxed = false
  if penalty then
    pkey = keys[base + leaves + 1]
    rec = records[pkey]
    if rec == nil then
      rec = { 0, 0, 0 }
      local raw = read[base + leaves + 1]
      if raw then
        local s, u, l = string.match(raw, '^(%d+):(%d+):(%d+)$')
        if s then rec = { tonumber(s), tonumber(u), tonumber(l) } end
      end
      records[pkey] = rec
    end
    boxed = rec[2] > now
  end
  -- Each leaf's verdict (whether it is reached), and the fold: admitted when every leaf
  -- admits; its wait never when a leaf's cost exceeds its capacity.
  local admits, fits = true, true
  for j = 1, leaves do
    local key = keys[base + j]
    if p[4 * j] == 1 then
      local tat = written[key]
      if tat == nil then
        local value = read[base + j]
        tat = value and tonumber(value) or 0
      end
      tats[j] = tat
      local interval, burst = p[1 + 4 * j], p[2 + 4 * j]
      local tau = burst * interval
      local inc = cost * interval
      local from = tat
      if from < now then from = now end
      local debt = from - now
      size = size + 1
      out[size] = debt
      if tree then reached[j], never[j] = debt > tau - inc, inc > tau end
      if inc > tau then fits = false end
      if debt > tau - inc then admits = false end
    elseif p[4 * j] == 4 then
      -- fixed.load (the state recorded earlier in the batch, else the one read) and
      -- fixed.verdict: the count so far in the current window.
      local limit, length = p[1 + 4 * j], p[2 + 4 * j]
      local window, count = windows[key], counts[key]
      if window == nil then
        window, count = 0, 0
        local raw = read[base + j]
        if raw then
          local w, c = string.match(raw, '^(%d+):(%d+)$')
          if w then window, count = tonumber(w), tonumber(c) end
        end
      end
      local current = (now - now % length) / length
      local used = 0
      if window == current then used = count end
      tats[j], currents[j] = used, current
      size = size + 1
      out[size] = used
      if tree then reached[j], never[j] = used + cost > limit, cost > limit end
      if cost > limit then fits = false end
      if used + cost > limit then admits = false end
    elseif p[4 * j] == 3 then
      -- log.verdict's reads, as in log_batch.lua: the newest time, then the units after
      -- now - window, which there are none of when the newest is not.
      local limit, window = p[1 + 4 * j], p[2 + 4 * j]
      local log = known[key]
      if log == nil or log[1] ~= window then
        local used, top = 0, redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
        if top then
          top = tonumber(top)
          if top > now - window then
            used = redis.call('ZCOUNT', key, '(' .. format('%d', now - window), '+inf')
          end
        end
        local saved = nil
        if log then saved = log[6] end
        log = { window, used, top, false, {}, saved }
        known[key] = log
      end
      local used = log[2]
      local k = used + cost - limit
      local kth, next = 0, 0
      if cost <= limit then
        if k >= 1 then kth = kth_time(key, log, k) end
        if recording == 1 and k + cost >= 1 and k + cost <= used then
          next = kth_time(key, log, k + cost)
        end
      end
      local top = 0
      if used > 0 then top = log[3] end
      out[size + 1], out[size + 2], out[size + 3], out[size + 4] = used, top, kth, next
      size = size + 4
      if tree then reached[j], never[j] = k > 0, cost > limit end
      if cost > limit then fits = false end
      if k > 0 then admits = false end
    else
      -- sliding.load, as in sliding_batch.lua: the state recorded earlier in the batch, else
      -- the one read (kept for the next hit of the same G); a state of another G is fresh.
      local limit, sub, g = p[1 + 4 * j], p[2 + 4 * j], p[3 + 4 * j]
      local st = states[key]
      if gs[key] ~= g then
        if subs[key] ~= nil then
          st = fresh(g)
        else
          local raw = read[base + j]
          local ok, packed = false, nil
          if raw then ok, packed = pcall(cmsgpack.unpack, raw) end
          if ok and type(packed) == 'table' and #packed == g + 1 then
            st = packed
          else
            st = fresh(g)
          end
          states[key], gs[key] = st, g
        end
      end
      -- sliding.verdict's count: the sub-windows counted at now that the state still holds.
      local current = (now - now % sub) / sub
      local newest = st[1]
      local lo, hi = current + 1 - g, current
      if lo < 0 then lo = 0 end
      if newest - g + 1 > lo then lo = newest - g + 1 end
      if newest < hi then hi = newest end
      local used = 0
      for n = lo, hi do used = used + st[2 + n % g] end
      -- The reply, what a decision reads of the window (see the head of this file): the
      -- current sub-window's count, the newest earlier one holding units, and where the k-th
      -- and the k2-th oldest units lie, as sub-windows back from the current one.
      local cur = 0
      if hi == current and lo <= current then cur = st[2 + current % g] end
      local before = used - cur
      local prev = 0
      if before > 0 then
        local n = hi
        if n == current then n = current - 1 end
        while st[2 + n % g] == 0 do n = n - 1 end
        prev = current - n
      end
      -- What the window counts once recorded: the cost goes to the current sub-window, at
      -- most twice the limit, or to a newer one than now (the clock stepped back), uncounted.
      local recorded, ahead = used, 0
      if newest > current then
        ahead = newest - current
      else
        local total = cur + cost
        if total > limit * 2 then total = limit * 2 end
        recorded = before + total
      end
      local k, k2 = used + cost - limit, recorded + cost - limit
      local first, second = 0, 0
      local want1 = cost <= limit and k >= 1 and k <= before
      local want2 = recording == 1 and cost <= limit and k2 >= 1 and k2 <= before
      if want1 or want2 then
        local sum = 0
        for n = lo, hi do
          sum = sum + st[2 + n % g]
          if want1 and first == 0 and sum >= k then first = current - n end
          if want2 and second == 0 and sum >= k2 then second = current - n end
          if (first > 0 or not want1) and (second > 0 or not want2) then break end
        end
      end
      out[size + 1], out[size + 2], out[size + 3], out[size + 4] = used, cur, prev, first
      out[size + 5], out[size + 6] = second, ahead
      size = size + 6
      tats[j], currents[j] = st, current
      if tree then reached[j], never[j] = used + cost > limit, cost > limit end
      if cost > limit then fits = false end
      if used + cost > limit then admits = false end
    end
  end
  if tree then
    -- The tree's fold replaces the `or` of every leaf's.
    local _, r, n = fold(tree, 1, reached, never)
    admits, fits = not r, not n
  end
  if rec then
    out[size + 1], out[size + 2], out[size + 3] = rec[1], rec[2], rec[3]
    size = size + 3
  end
  if not boxed and recording ~= 2 and fits and (recording == 1 or admits) then
    for j = 1, leaves do
      local key = keys[base + j]
      if p[4 * j] == 1 then
        -- gcra.record: max(min(max(tat, now) + inc, now + tau + window), tat).
        local interval, burst, window = p[1 + 4 * j], p[2 + 4 * j], p[3 + 4 * j]
        local tat = tats[j]
        local from = tat
        if from < now then from = now end
        local recorded, cap = from + cost * interval, now + burst * interval + window
        if recorded > cap then recorded = cap end
        if recorded < tat then recorded = tat end
        if written[key] == nil then order[#order + 1] = key end
        written[key] = recorded
      elseif p[4 * j] == 3 then
        -- log.record, as in log_batch.lua: the expired members go (once per key, and none
        -- from an empty log), then one member per unit, at most `limit`, and the oldest go
        -- when there are more than `limit`.
        local limit, window = p[1 + 4 * j], p[2 + 4 * j]
        local log = known[key]
        local used, top = log[2], log[3]
        if top and not log[4] then
          redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - window))
        end
        log[4] = true
        if used == 0 then top = nil end
        local units = cost
        if units > limit then units = limit end
        if units > 0 then
          if stamp == nil then stamp, token = format('%d', now), ARGV[#ARGV] end
          local added, args = 0, {}
          for _ = 1, units do
            serial = serial + 1
            args[#args + 1] = stamp
            args[#args + 1] = stamp .. ':' .. token .. ':' .. serial
            if #args >= 2000 then
              added = added + redis.call('ZADD', key, unpack(args))
              args = {}
            end
          end
          if #args > 0 then added = added + redis.call('ZADD', key, unpack(args)) end
          used = used + added
          if used > limit then
            redis.call('ZREMRANGEBYRANK', key, 0, used - limit - 1)
            used = limit
          end
          -- The newest is now, unless Redis's clock stepped back below a member's time.
          if top == nil or top < now then top = now end
        end
        log[2], log[3], log[5] = used, top, {}
        if logs == nil then logs = {} end
        if log[6] == nil then logs[#logs + 1] = key end
        log[6] = window
      elseif p[4 * j] == 4 then
        -- fixed.record: the count, at most twice the limit, in the current window.
        local limit = p[1 + 4 * j]
        local total = tats[j] + cost
        if total > limit * 2 then total = limit * 2 end
        if windows[key] == nil then fixed[#fixed + 1] = key end
        windows[key], counts[key], lengths[key] = currents[j], total, p[2 + 4 * j]
      else
        -- sliding.record: the sub-windows the window slid past cleared, then the cost, at
        -- most twice the limit, in the newest.
        local limit, sub, g = p[1 + 4 * j], p[2 + 4 * j], p[3 + 4 * j]
        local st, current = tats[j], currents[j]
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
        if subs[key] == nil then slid[#slid + 1] = key end
        states[key], gs[key], subs[key] = st, g, sub
      end
    end
  end
  if penalty and not boxed and not admits and fits and recording ~= 2 then
    -- penalty_strike: a new record, so the values this hit answered stay as they were.
    local count, last = rec[1], rec[3]
    if count > 0 and now - last >= penalty[4] then count = 0 end
    count = count + 1
    local timeout = penalty[1] * penalty[2] ^ (count - 1)
    if timeout > penalty[3] then timeout = penalty[3] end
    records[pkey] = { count, now + timeout, now }
    if struck[pkey] == nil then strikes[#strikes + 1] = pkey end
    struck[pkey] = penalty[4]
  end
  base = base + leaves
  if penalty then base = base + 1 end
end
-- The saves below are copies of gcra_batch.lua's, fixed_batch.lua's, sliding_batch.lua's and
-- log_batch.lua's, not functions the scripts share: a shared prelude of save functions
-- (placed before each script as decimal.lua is) cost Redis 0.8-2.7% more instructions a hit in
-- benches/lua_instructions.sh, the most on one GCRA leaf (26,188 to 26,826 on 1,000,000
-- keys), for the closures each call makes and a call per key written.
-- gcra.save, once per key, as in gcra_batch.lua: the final TAT with its expiry in the same
-- command, or the key deleted when that TAT is not later than now.
for j = 1, #order do
  local key = order[j]
  local recorded = written[key]
  if recorded <= now then
    redis.call('DEL', key)
  else
    local left = recorded - now + 999
    local ms = decimal((left - left % 1000) / 1000)
    redis.call('PSETEX', key, ms, decimal(recorded))
  end
end
-- fixed.save, once per key, as in fixed_batch.lua: the state with its expiry (the window's
-- end), or the key deleted when its count is 0 or its window has ended.
for j = 1, #fixed do
  local key = fixed[j]
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
-- sliding.save, once per key, as in sliding_batch.lua: the state with its expiry (the end of
-- the window of its newest counted sub-window), or the key deleted when nothing in it is
-- still counted.
for j = 1, #slid do
  local key = slid[j]
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
-- log.save, once per key, as in log_batch.lua: the expiry is the newest member's time plus
-- the window of the key's last recording; an empty log is gone already.
for j = 1, logs and #logs or 0 do
  local key = logs[j]
  local log = known[key]
  local top = log[3]
  if top then
    local expires_at = top + log[6]
    if expires_at <= now then
      redis.call('DEL', key)
    else
      local left = expires_at - now + 999
      redis.call('PEXPIRE', key, format('%d', (left - left % 1000) / 1000))
    end
  end
end
-- penalty_save, once per struck record: kept until its box is over and its strikes are
-- forgotten (the later of the two).
for j = 1, #strikes do
  local key = strikes[j]
  local rec = records[key]
  local expires_at = rec[2]
  if rec[3] + struck[key] > expires_at then expires_at = rec[3] + struck[key] end
  if expires_at <= now then
    redis.call('DEL', key)
  else
    local left = expires_at - now + 999
    local ms = format('%d', (left - left % 1000) / 1000)
    redis.call('PSETEX', key, ms, format('%d:%d:%d', rec[1], rec[2], rec[3]))
  end
end
return out

-- The ceiling to compare against: the least a GCRA decision in Redis can do (no rule tree,
-- no options, one key). ARGV: interval and burst in microseconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
local new = tat + interval
if new - now > burst * interval then
  return 0
end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1)
return 1

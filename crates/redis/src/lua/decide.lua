-- Entry point: decide with Redis's own clock, never the caller's.
local time = redis.call('TIME')
return run(tonumber(time[1]) * 1000000 + tonumber(time[2]))

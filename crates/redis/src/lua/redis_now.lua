-- Entry of a lean script: the time is Redis's own clock, never the caller's.
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]

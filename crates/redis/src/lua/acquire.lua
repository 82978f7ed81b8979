-- Entry: take lease ARGV[#ARGV] (see `acquire` in leases.lua), with Redis's own clock.
return acquire(redis_time(), ARGV[#ARGV])

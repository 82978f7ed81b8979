-- Entry: renew a lease (see `renew` in leases.lua), with Redis's own clock.
return renew(redis_time())

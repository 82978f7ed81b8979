-- Entry: release a lease (see `release` in leases.lua), with Redis's own clock.
return release(redis_time())

-- Entry: settle a reservation (see `settle` in reservations.lua), with Redis's own clock.
return settle(redis_time())

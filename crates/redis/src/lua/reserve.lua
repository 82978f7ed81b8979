-- Entry: decide a reservation (see `reserve` in reservations.lua), with Redis's own clock.
return reserve(redis_time())

-- A fleet process reached Redis (every POLLING_CLOCK_TICK_SECONDS, rollout_core/polling_clock.py):
-- the polling leases' clock ticks, and catches up on an outage if it is the first to see it.
-- -> {outages, away_ms}: how many outages the clock has found, and the last one's length
polling_now()
return redis.call('HMGET', CLOCK, CLOCK_FIELD.outages, CLOCK_FIELD.away_ms)

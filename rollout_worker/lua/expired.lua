-- Rollouts whose lease has lapsed (their worker died or stalled), by Redis's clock.
-- KEYS: leases   ARGV: limit
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))

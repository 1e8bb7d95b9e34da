-- Rollouts whose worker lease has lapsed (their worker died or stalled).
-- ARGV: limit
return redis.call('ZRANGEBYSCORE', LEASES, '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))

-- v2 rollouts whose polling lease ran out (nobody polled them in time).
-- ARGV: limit
return redis.call('ZRANGEBYSCORE', POLLS, '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))

-- v2 rollouts whose polling lease ran out (nobody polled them in time), by polling_now's
-- clock (time the fleet's Redis could not answer does not count).
-- ARGV: limit
return redis.call('ZRANGEBYSCORE', POLLING_LEASES, '-inf', polling_now(), 'LIMIT', 0, tonumber(ARGV[1]))

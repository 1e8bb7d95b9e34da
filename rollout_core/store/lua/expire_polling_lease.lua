-- Finish a v2 rollout nobody polled in time (its trainer is gone) with the given lease-expired
-- result, and stop its execution; unless a poll renewed its lease since it was found overdue.
-- KEYS: record   ARGV: lease_expired_result, ttl_ms
-- -> 1 expired, 0 nothing to do
if not due(POLLING_LEASES, KEYS[1], polling_now()) then
  return 0
end
redis.call('ZREM', POLLING_LEASES, KEYS[1])
local status = redis.call('HGET', KEYS[1], FIELD.status)
if not status or TERMINAL[status] then
  return 0
end
terminate(KEYS[1], STATUS.failure, ARGV[1], ARGV[2])
redis.call('PUBLISH', STOPS, KEYS[1])
return 1

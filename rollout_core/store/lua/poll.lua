-- A trainer's poll of a v2 rollout: authenticate the lease digest, then either return the
-- final result, expire an overdue lease (finishing the rollout with the given lease-expired
-- result and stopping its execution), or renew the lease and report the status. Deadlines
-- run on polling_now's clock: time the fleet's Redis could not answer does not count.
-- The digest comparison is not constant-time; it cannot leak the token (a SHA-256 preimage).
-- KEYS: record   ARGV: lease_digest, polling_lease_ms, ttl_ms, lease_expired_result
-- -> {POLL.unknown} | {POLL.forbidden} | {POLL.final, result, status} | {POLL.status, status}
local fields = redis.call('HMGET', KEYS[1], FIELD.status, FIELD.lease_digest, FIELD.result)
if not fields[1] then
  return {POLL.unknown}
end
if fields[2] ~= ARGV[1] then
  return {POLL.forbidden}
end
if TERMINAL[fields[1]] then
  return {POLL.final, fields[3], fields[1]}
end
local now = polling_now()
if due(POLLING_LEASES, KEYS[1], now) then
  terminate(KEYS[1], STATUS.failure, ARGV[4], ARGV[3])
  redis.call('PUBLISH', STOPS, KEYS[1])
  return {POLL.final, ARGV[4], STATUS.failure}
end
redis.call('ZADD', POLLING_LEASES, now + tonumber(ARGV[2]), KEYS[1])
return {POLL.status, fields[1]}

-- A trainer's poll of a v2 rollout: authenticate the lease digest, then either return the
-- final result, expire an overdue lease (finishing the rollout with the given lease-expired
-- result and stopping its execution), or renew the lease and report the status.
-- The digest comparison is not constant-time; it cannot leak the token (a SHA-256 preimage).
-- KEYS: record   ARGV: lease_digest, poll_lease_ms, ttl_ms, lease_expired_result
-- -> {POLL.unknown} | {POLL.forbidden} | {POLL.final, result} | {POLL.status, status}
local fields = redis.call('HMGET', KEYS[1], FIELD.status, FIELD.lease_digest, FIELD.result,
                          FIELD.poll_deadline)
if not fields[1] then
  return {POLL.unknown}
end
if fields[2] ~= ARGV[1] then
  return {POLL.forbidden}
end
if TERMINAL[fields[1]] then
  return {POLL.final, fields[3]}
end
local now = now_ms()
if tonumber(fields[4]) <= now then
  terminate(KEYS[1], STATUS.failure, ARGV[4], ARGV[3])
  redis.call('PUBLISH', STOPS, KEYS[1])
  return {POLL.final, ARGV[4]}
end
-- Renewed only when that moves the deadline by over a tenth of the lease: a trainer polling
-- in a tight loop does not rewrite it on every poll (the lease it holds stays >= 90 %).
local deadline = now + tonumber(ARGV[2])
if deadline - tonumber(fields[4]) > tonumber(ARGV[2]) / 10 then
  redis.call('HSET', KEYS[1], FIELD.poll_deadline, deadline)
  redis.call('ZADD', POLLS, deadline, KEYS[1])
end
return {POLL.status, fields[1]}

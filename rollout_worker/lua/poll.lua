-- A trainer's poll of a v2 rollout: authenticate the lease digest, then either return the
-- final result, expire an overdue lease (finishing the rollout as lease_expired and stopping
-- its execution), or renew the lease and report the status.
-- The digest comparison is not constant-time; it cannot leak the token (a SHA-256 preimage).
-- KEYS: record   ARGV: lease_digest, poll_lease_ms, ttl_ms
-- -> {'unknown'} | {'forbidden'} | {'final', result} | {'status', status}
local fields = redis.call('HMGET', KEYS[1], 'status', 'lease_digest', 'result', 'poll_deadline')
if not fields[1] then
  return {'unknown'}
end
if fields[2] ~= ARGV[1] then
  return {'forbidden'}
end
if is_terminal(fields[1]) then
  return {'final', fields[3]}
end
local now = now_ms()
if tonumber(fields[4]) <= now then
  local result = v2_result(KEYS[1], 'failure', 'polling lease expired', 'lease_expired')
  terminate(KEYS[1], 'failure', result, ARGV[3])
  redis.call('PUBLISH', STOPS, KEYS[1])
  return {'final', result}
end
redis.call('HSET', KEYS[1], 'poll_deadline', now + tonumber(ARGV[2]))
redis.call('ZADD', POLLS, now + tonumber(ARGV[2]), KEYS[1])
return {'status', fields[1]}

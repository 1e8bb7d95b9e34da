-- Move a rollout on; only its lease owner may. A terminal status drops the secret, the
-- lease and the in-flight entry, and starts the retention TTL.
-- KEYS: record, leases, active, finished
-- ARGV: owner, status, result ('' keeps the stored one), ttl_ms, field, value, ...
-- -> 1, or 0 when this worker no longer owns the rollout (its result is discarded)
local fields = redis.call('HMGET', KEYS[1], 'owner', 'status')
if fields[1] ~= ARGV[1] or not is_held(fields[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], unpack(ARGV, 5))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'result', ARGV[3])
end
if is_terminal(ARGV[2]) then
  local now = now_ms()
  redis.call('HSET', KEYS[1], 'finished_at', now)
  redis.call('HDEL', KEYS[1], 'secret', 'owner')
  redis.call('ZREM', KEYS[2], KEYS[1])
  redis.call('ZREM', KEYS[3], KEYS[1])
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 1

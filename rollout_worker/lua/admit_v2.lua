-- Admit a v2 rollout, checks in the protocol's order: draining, capacity, duplicate.
-- KEYS: record, queue
-- ARGV: max_queued, poll_lease_ms, ttl_ms, rollout_id, message, field, value, ...
-- -> 'draining' | 'full' | 'duplicate' | 'queued'
if redis.call('EXISTS', DRAINING) == 1 then
  return 'draining'
end
if redis.call('LLEN', KEYS[2]) >= tonumber(ARGV[1]) then
  return 'full'
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 'duplicate'
end
local now = now_ms()
local deadline = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'status', 'queued', 'accepted_at', now, 'attempt', 0,
           'poll_deadline', deadline, unpack(ARGV, 6))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', ACTIVE, now, KEYS[1])
redis.call('ZADD', POLLS, deadline, KEYS[1])
redis.call('ZADD', V2IDS, 0, ARGV[4])
redis.call('LPUSH', KEYS[2], ARGV[5])
return 'queued'

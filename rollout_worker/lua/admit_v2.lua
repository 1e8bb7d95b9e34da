-- Admit a v2 rollout, checks in the protocol's order: draining, capacity, duplicate.
-- KEYS: record, queue
-- ARGV: max_queued, poll_lease_ms, ttl_ms, rollout_id, message, lease_digest, field, value, ...
-- -> 'draining' | 'full' | 'duplicate' | 'queued'
-- The same admission sent again (a client retrying after its connection to Redis broke, the
-- first reply lost) carries the same lease digest: it is answered 'queued' again, once.
if redis.call('HGET', KEYS[1], 'lease_digest') == ARGV[6] then
  return 'queued'
end
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
           'poll_deadline', deadline, 'lease_digest', ARGV[6], unpack(ARGV, 7))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', ACTIVE, now, KEYS[1])
redis.call('ZADD', POLLS, deadline, KEYS[1])
redis.call('ZADD', V2IDS, 0, ARGV[4])
redis.call('LPUSH', KEYS[2], ARGV[5])
return 'queued'

-- Hand a rollout whose lease lapsed back to the front of the queue, unless someone renewed it.
-- KEYS: record, queue   ARGV: message
-- -> 1 requeued, 0 nothing to do
local expiry = redis.call('ZSCORE', LEASES, KEYS[1])
if not expiry or tonumber(expiry) > now_ms() then
  return 0
end
redis.call('ZREM', LEASES, KEYS[1])
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'running' or status == 'grading' then
  redis.call('HSET', KEYS[1], 'status', 'queued')
  redis.call('PUBLISH', CHANGES, KEYS[1])
elseif status ~= 'delivering' then
  return 0
end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1

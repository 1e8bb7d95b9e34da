-- Hand a rollout whose lease lapsed back to the queue (front), unless someone renewed it.
-- KEYS: record, leases, queue   ARGV: message
-- -> 1 requeued, 0 nothing to do
local expiry = redis.call('ZSCORE', KEYS[2], KEYS[1])
if not expiry or tonumber(expiry) > now_ms() then
  return 0
end
redis.call('ZREM', KEYS[2], KEYS[1])
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'running' or status == 'grading' then
  redis.call('HSET', KEYS[1], 'status', 'queued')
elseif status ~= 'delivering' then
  return 0
end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('RPUSH', KEYS[3], ARGV[1])
return 1

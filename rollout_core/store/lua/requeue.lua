-- Hand a rollout whose lease lapsed back to the front of the queue, unless someone renewed it.
-- KEYS: record, queue   ARGV: message
-- -> 1 requeued, 0 nothing to do
if not due(LEASES, KEYS[1]) then
  return 0
end
redis.call('ZREM', LEASES, KEYS[1])
local status = redis.call('HGET', KEYS[1], FIELD.status)
if status == STATUS.running or status == STATUS.grading then
  redis.call('HSET', KEYS[1], FIELD.status, STATUS.queued)
  publish_change(KEYS[1], STATUS.queued)
elseif status ~= STATUS.delivering then
  return 0
end
redis.call('HDEL', KEYS[1], FIELD.execution)
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1

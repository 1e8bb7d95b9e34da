-- Hand a rollout whose lease lapsed back to the front of the queue, unless someone renewed it.
-- A rollout it was running (not delivering) crashed with its worker: forgive_shared_crash.
-- KEYS: record, queue   ARGV: message, max_attempts
-- -> 1 requeued, 0 nothing to do
-- Its first write is the RPUSH: Redis refuses it at maxmemory, and with it the whole script. A
-- first write Redis allows when full (ZREM frees memory) would let every write after it through:
-- a full Redis refuses every lease renewal, and a requeue then ran live rollouts twice.
if not due(LEASES, KEYS[1]) then
  return 0
end
local status = redis.call('HGET', KEYS[1], FIELD.status)
local rerun = status == STATUS.running or status == STATUS.grading
if not rerun and status ~= STATUS.delivering then
  redis.call('ZREM', LEASES, KEYS[1])
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('ZREM', LEASES, KEYS[1])
if rerun then
  forgive_shared_crash(KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], FIELD.status, STATUS.queued)
  publish_change(KEYS[1], STATUS.queued)
end
redis.call('HDEL', KEYS[1], FIELD.execution)
return 1

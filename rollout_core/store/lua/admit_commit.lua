-- Finish a v1 admission: record queued + task message enqueued, in one step.
-- KEYS: record, queue[, alias: when the rollout id is not the record id]   ARGV: admit_token, ttl_ms, message ('': enqueued by the caller once
--                      the replicas confirm the record), field, value, ...
-- -> 1, or 0 if this admission lost its admission key (its pending TTL ran out) or committed already
--    (a retry after the first reply was lost: the caller replays the stored response)
-- The token stays in the record once committed (it is no secret); the status tells a
-- commit that already happened.
local held = redis.call('HMGET', KEYS[1], FIELD.admit_token, FIELD.status)
if held[1] ~= ARGV[1] or held[2] ~= STATUS.admitting then
  return 0
end
local now = now_ms()
redis.call('HSET', KEYS[1], FIELD.status, STATUS.queued, FIELD.accepted_at, now,
           FIELD.attempt, 0, unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if KEYS[3] then
  redis.call('SET', KEYS[3], KEYS[1], 'PX', ARGV[2])
end
redis.call('ZADD', ACTIVE, now, KEYS[1])
if ARGV[3] ~= '' then
  redis.call('LPUSH', KEYS[2], ARGV[3])
end
return 1

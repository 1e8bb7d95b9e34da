-- Finish a v1 admission: record queued + task message enqueued, in one step.
-- KEYS: record, queue   ARGV: admit_token, ttl_ms, message, field, value, ...
-- -> 1, or 0 if this admission lost its claim (its pending TTL ran out)
if redis.call('HGET', KEYS[1], FIELD.admit_token) ~= ARGV[1] then
  return 0
end
-- The token stays in the record: it is no secret, and no later step reads it.
local now = now_ms()
redis.call('HSET', KEYS[1], FIELD.status, STATUS.queued, FIELD.accepted_at, now,
           FIELD.attempt, 0, unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', ACTIVE, now, KEYS[1])
redis.call('LPUSH', KEYS[2], ARGV[3])
return 1

-- A message a worker took from the queue and never started (it died between taking it and
-- claiming the rollout) goes back to the front of the queue now, not at the broker's
-- visibility timeout. Its unacked entry goes with it, as kombu's own restore does.
-- KEYS: record, unacked, unacked_index, queue   ARGV: delivery tag, message
-- -> 1 restored, 0 nothing to do (the rollout started since, or the message was acked)
if redis.call('HGET', KEYS[1], FIELD.status) ~= STATUS.queued then
  return 0
end
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('RPUSH', KEYS[4], ARGV[2])
return 1

-- A worker hands a rollout back to the front of the queue at once (not when its lease would
-- lapse): one it runs, when it stops (SIGTERM) or recycles itself (its event loop stalled),
-- or one it took from the queue but never started (its message dies with the worker).
-- A rollout delivering its result is handed back only when the caller says none of its
-- callbacks went out (and none will: the worker barred them first); otherwise its callback
-- may be in flight, and a second worker would post it again.
-- KEYS: record, queue   ARGV: execution ('' for one never started), message, reason,
--                             unposted ('1': a delivering rollout whose callback never went out)
--   reason (optional): the rollout is abandoned; its next claim fails it with this reason
-- -> 1 handed back, 0 not (not this execution's any more, started elsewhere, or delivering)
local fields = redis.call('HMGET', KEYS[1], FIELD.execution, FIELD.status)
if ARGV[1] == '' then
  if fields[2] ~= STATUS.queued then
    return 0
  end
  -- Its message stays with the dying worker until the broker restores it: a duplicate,
  -- which the claim turns away.
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
if fields[1] ~= ARGV[1] then
  return 0
end
local delivering = fields[2] == STATUS.delivering
if delivering and ARGV[4] == '1' then
  -- Its result stays stored, to be delivered by whoever claims it next: neither this
  -- execution nor the delivery that follows counts (the claim counts one).
  redis.call('ZREM', LEASES, KEYS[1])
  redis.call('HDEL', KEYS[1], FIELD.execution)
  redis.call('HINCRBY', KEYS[1], FIELD.attempt, -1)
  redis.call('HINCRBY', KEYS[1], FIELD.deliveries, -1)
  redis.call('HINCRBY', KEYS[1], FIELD.handoffs, 1)
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
if fields[2] ~= STATUS.running and fields[2] ~= STATUS.grading then
  return 0
end
redis.call('ZREM', LEASES, KEYS[1])
redis.call('HSET', KEYS[1], FIELD.status, STATUS.queued)
redis.call('HDEL', KEYS[1], FIELD.execution)
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], FIELD.abandon_reason, ARGV[3])
else
  -- A hand-back is not a crash: it must not count towards max_attempts.
  redis.call('HINCRBY', KEYS[1], FIELD.attempt, -1)
  redis.call('HINCRBY', KEYS[1], FIELD.handoffs, 1)
end
redis.call('RPUSH', KEYS[2], ARGV[2])
publish_change(KEYS[1], STATUS.queued)
return 1

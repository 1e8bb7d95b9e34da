-- Cancel one rollout. Queued v2: finished as cancelled at once. Queued v1, or running:
-- cancellation is requested and the executing worker (or, for a queued v1 rollout, the
-- worker that claims it) stops it and records the outcome. Idempotent.
-- KEYS: record   ARGV: ttl_ms
-- -> 'cancelled_queued' | 'cancelled_running' | 'not_found' (finished) | 'unknown'
local fields = redis.call('HMGET', KEYS[1], 'status', 'protocol')
local status = fields[1]
if not status or status == 'admitting' then
  return 'unknown'
end
if is_terminal(status) then
  return 'not_found'
end
if status == 'queued' and fields[2] == 'v2' then
  terminate(KEYS[1], 'cancelled', v2_result(KEYS[1], 'cancelled', 'cancelled'), ARGV[1])
  return 'cancelled_queued'
end
redis.call('HSET', KEYS[1], 'cancel_requested', 1)
redis.call('PUBLISH', STOPS, KEYS[1])
if status == 'queued' then
  return 'cancelled_queued'
end
return 'cancelled_running'

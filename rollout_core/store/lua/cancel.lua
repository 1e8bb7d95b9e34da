-- Cancel one rollout. Queued, with a cancelled result given (v2): finished as cancelled at
-- once. Queued without one (v1: its trainer hears through the callback), or running:
-- cancellation is requested and the executing worker (or, for a queued rollout, the worker
-- that claims it) stops it and records the outcome. Idempotent.
-- KEYS: record   ARGV: ttl_ms, cancelled_result ('' for none)
-- -> CANCEL.cancelled_queued | CANCEL.cancelled_running | CANCEL.finished | CANCEL.unknown
local status = redis.call('HGET', KEYS[1], FIELD.status)
if not status then
  return CANCEL.unknown
end
-- A v1 admission still running (get_tools): the request waits in the record; once committed
-- the rollout is queued with it, and the worker that claims it cancels it. An admission that
-- fails takes the record, and the request, with it.
if status == STATUS.admitting then
  redis.call('HSET', KEYS[1], FIELD.cancel_requested, 1)
  return CANCEL.cancelled_queued
end
-- A delivering v1 rollout has its result, and its callback may be on the wire: stopping it
-- could only make the trainer hear twice. It counts as finished.
if TERMINAL[status] or status == STATUS.delivering then
  return CANCEL.finished
end
if status == STATUS.queued and ARGV[2] ~= '' then
  terminate(KEYS[1], STATUS.cancelled, ARGV[2], ARGV[1])
  return CANCEL.cancelled_queued
end
redis.call('HSET', KEYS[1], FIELD.cancel_requested, 1)
redis.call('PUBLISH', STOPS, KEYS[1])
if status == STATUS.queued then
  return CANCEL.cancelled_queued
end
return CANCEL.cancelled_running

-- A worker takes a rollout: only if it is queued, or its previous holder's lease lapsed.
-- A repeat of this same claim (its first reply was lost, the client ran it again) answers
-- as the first did, without counting another attempt.
-- KEYS: record   ARGV: execution (this execution's lease), worker (its process), lease_ms,
--                      max_attempts, task (the Celery task id of the message)
-- -> {VERDICT.missing} | {VERDICT.done} | {VERDICT.busy}
--    | {verdict, attempt, ms_since_accepted, field, value, ...}
--    verdict: VERDICT.running (run it), VERDICT.delivering (a stored result awaits delivery),
--             VERDICT.cancelled (cancel was requested), VERDICT.exhausted (too many attempts:
--             fail it), VERDICT.abandoned (a worker gave it up, its reason in the record)
local now = now_ms()
local fields = redis.call('HMGET', KEYS[1], FIELD.status, FIELD.accepted_at,
                          FIELD.cancel_requested, FIELD.abandon_reason, FIELD.execution,
                          FIELD.attempt, FIELD.started_at)
local status = fields[1]
if not status or status == STATUS.admitting then
  return {VERDICT.missing}
end
if TERMINAL[status] then
  return {VERDICT.done}
end
local repeated = fields[5] == ARGV[1] and HELD[status]
if status ~= STATUS.queued and not repeated then
  local expiry = redis.call('ZSCORE', LEASES, KEYS[1])
  if expiry and tonumber(expiry) > now then
    return {VERDICT.busy}
  end
end
local phase = STATUS.running
if status == STATUS.delivering then
  phase = STATUS.delivering
end
local attempt = tonumber(fields[6] or 0)
if not repeated then
  attempt = attempt + 1
  redis.call('HSET', KEYS[1], FIELD.status, phase, FIELD.execution, ARGV[1], FIELD.worker, ARGV[2],
             FIELD.claimed_at, now, FIELD.task, ARGV[5], FIELD.attempt, attempt,
             FIELD.started_at, fields[7] or now)
  redis.call('ZADD', LEASES, now + tonumber(ARGV[3]), KEYS[1])
  if status ~= phase then
    publish_change(KEYS[1], phase)
  end
end
-- A delivering rollout has its result: it is delivered, never refused (a refusal would
-- replace a result the trainer may already have received).
local verdict = VERDICT.running
if phase == STATUS.delivering then
  verdict = VERDICT.delivering
elseif fields[3] then
  verdict = VERDICT.cancelled
elseif fields[4] then
  verdict = VERDICT.abandoned
elseif attempt > tonumber(ARGV[4]) then
  verdict = VERDICT.exhausted
end
return {verdict, attempt, now - tonumber(fields[2] or now), unpack(redis.call('HGETALL', KEYS[1]))}

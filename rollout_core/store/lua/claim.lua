-- A worker takes a rollout: only if it is queued, or its previous holder's lease lapsed.
-- A repeat of this same claim (its first reply was lost, the client ran it again) answers
-- as the first did, without counting another attempt.
-- A takeover of a lapsed lease (its worker crashed running it) counts only as
-- forgive_shared_crash (_prelude.lua) says; max_attempts bounds the attempts counted.
-- KEYS: record   ARGV: execution (this execution's lease), worker (its process), lease_ms,
--                      max_attempts, task (the Celery task id of the message),
--                      alone ('1': the worker runs nothing else beside it)
-- -> {VERDICT.missing} | {VERDICT.done} | {VERDICT.busy}
--    | {verdict, attempt, ms_since_accepted, field, value, ...}
--    verdict: VERDICT.running (run it), VERDICT.delivering (a stored result awaits delivery),
--             VERDICT.cancelled (cancel was requested), VERDICT.exhausted (too many attempts:
--             fail it), VERDICT.abandoned (a worker gave it up, its reason in the record)
local now = now_ms()
-- One read of the whole record: the checks below, and the reply (the worker runs from it).
local pairs_read = redis.call('HGETALL', KEYS[1])
local record = {}
for i = 1, #pairs_read, 2 do
  record[pairs_read[i]] = pairs_read[i + 1]
end
local status = record[FIELD.status]
if not status or status == STATUS.admitting then
  return {VERDICT.missing}
end
if TERMINAL[status] then
  return {VERDICT.done}
end
local repeated = record[FIELD.execution] == ARGV[1] and LEASED[status]
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
local attempt = tonumber(record[FIELD.attempt] or 0)
-- A stored result has a budget of its own: a rollout whose runs used up its attempts is
-- still delivered, and one whose deliveries keep failing still ends.
local deliveries = tonumber(record[FIELD.deliveries] or 0)
local forgiven = tonumber(record[FIELD.forgiven] or 0)
local reply = {}
if not repeated then
  -- The lease first: a write Redis refuses (the wrong type of key, maxmemory) must fail the
  -- script before it changed the record, not leave it running without a lease.
  redis.call('ZADD', LEASES, now + tonumber(ARGV[3]), KEYS[1])
  if status == STATUS.running or status == STATUS.grading then
    forgiven = forgive_shared_crash(KEYS[1], ARGV[4])
  end
  attempt = attempt + 1
  if phase == STATUS.delivering then
    deliveries = deliveries + 1
  end
  -- The reply lists these after the fields read: a reader of the pairs keeps the last value.
  reply = {FIELD.status, phase, FIELD.execution, ARGV[1], FIELD.worker, ARGV[2],
           FIELD.claimed_at, now, FIELD.task, ARGV[5], FIELD.attempt, attempt,
           FIELD.started_at, record[FIELD.started_at] or now, FIELD.deliveries, deliveries,
           FIELD.forgiven, forgiven}
  if ARGV[6] == '1' then
    reply[#reply + 1], reply[#reply + 2] = FIELD.alone, ARGV[1]
  end
  redis.call('HSET', KEYS[1], unpack(reply))
  if status ~= phase then
    publish_change(KEYS[1], phase)
  end
end
-- A delivering rollout has its result: it is delivered, never refused (a refusal would
-- replace a result the trainer may already have received) - until its attempts run out like
-- any other's (counted apart): then it ends with that result, undelivered.
local verdict = VERDICT.running
if phase == STATUS.delivering then
  verdict = VERDICT.delivering
  if deliveries > tonumber(ARGV[4]) then
    verdict = VERDICT.exhausted
  end
elseif record[FIELD.cancel_requested] then
  verdict = VERDICT.cancelled
elseif record[FIELD.abandon_reason] then
  verdict = VERDICT.abandoned
elseif attempt - forgiven > tonumber(ARGV[4]) then
  verdict = VERDICT.exhausted
end
local answer = {verdict, attempt, now - tonumber(record[FIELD.accepted_at] or now)}
for _, items in ipairs({pairs_read, reply}) do
  for _, item in ipairs(items) do
    answer[#answer + 1] = tostring(item)
  end
end
return answer

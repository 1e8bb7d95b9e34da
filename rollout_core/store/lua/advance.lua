-- Move a rollout on (to a later status, terminal or not); only its lease holder may.
-- Terminal statuses go through terminate(). Once cancel was requested a rollout never ends
-- in success (PROTOCOL.md §2.5), however late the request came: a success (or a v1 result
-- about to be delivered) is replaced by the cancelled result the caller supplies, if any.
-- KEYS: record
-- ARGV: execution, status, result ('' keeps the stored one), ttl_ms, cancelled_result ('':
--       none), field, value, ...
-- -> ADVANCE.moved | ADVANCE.cancelled (the cancelled result was stored instead)
--    | ADVANCE.lost (this execution no longer holds the rollout: its result is discarded)
-- The same call again once it ended the rollout answers as the first did.
local fields = redis.call('HMGET', KEYS[1], FIELD.execution, FIELD.status, FIELD.cancel_requested,
                          FIELD.terminations, FIELD.ended_by)
if fields[1] ~= ARGV[1] or not LEASED[fields[2]] then
  -- This execution's own ending write, sent again (its reply was lost): what it did then.
  if fields[5] == ARGV[1] then
    if fields[2] == ARGV[2] then
      return ADVANCE.moved
    end
    if fields[2] == STATUS.cancelled and ARGV[2] == STATUS.success and ARGV[5] ~= '' then
      return ADVANCE.cancelled
    end
  end
  return ADVANCE.lost
end
local status, result, outcome = ARGV[2], ARGV[3], ADVANCE.moved
if fields[3] and ARGV[5] ~= '' and (status == STATUS.success or status == STATUS.delivering) then
  result, outcome = ARGV[5], ADVANCE.cancelled
  if status == STATUS.success then
    status = STATUS.cancelled
  end
end
if TERMINAL[status] then
  local writes = {unpack(ARGV, 6)}
  writes[#writes + 1], writes[#writes + 2] = FIELD.ended_by, ARGV[1]
  terminate(KEYS[1], status, result, ARGV[4], writes, tonumber(fields[4] or 0))
  return outcome
end
-- One write: the status, the result if any, the caller's fields.
local writes = {FIELD.status, status}
if result ~= '' then
  writes[3], writes[4] = FIELD.result, result
end
for i = 6, #ARGV do
  writes[#writes + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(writes))
publish_change(KEYS[1], status)
return outcome

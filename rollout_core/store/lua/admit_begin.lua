-- Start admitting a rollout, or report what is known about it.
-- KEYS: record   ARGV: admit_token, pending_ttl_ms
-- -> {START.lead} | {START.wait} (another admission is in progress)
--    | {START.replay, response, status}
local status = redis.call('HGET', KEYS[1], FIELD.status)
if not status then
  redis.call('HSET', KEYS[1], FIELD.status, STATUS.admitting, FIELD.admit_token, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {START.lead}
end
if status == STATUS.admitting then
  return {START.wait}
end
return {START.replay, redis.call('HGET', KEYS[1], FIELD.response), status}

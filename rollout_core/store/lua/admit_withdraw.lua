-- Take back a v1 admission its replicas did not confirm in time (its trainer is told 503), so
-- that it never runs nor calls back: a retry admits it afresh. Its message was held back
-- until the confirmation, so no worker has it. Only this admission's own commit is taken back.
-- KEYS: record   ARGV: admit_token
-- -> 1 if taken back, 0 if the record is not this admission's queued one
local held = redis.call('HMGET', KEYS[1], FIELD.admit_token, FIELD.status)
if held[1] ~= ARGV[1] or held[2] ~= STATUS.queued then
  return 0
end
follow_alias(KEYS[1], 0)
redis.call('DEL', KEYS[1])
redis.call('ZREM', ACTIVE, KEYS[1])
return 1

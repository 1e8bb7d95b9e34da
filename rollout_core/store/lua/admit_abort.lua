-- Forget a failed admission so a retry with the same key starts afresh (only while it is
-- still admitting: a committed record keeps its admission's token).
-- KEYS: record   ARGV: admit_token
local held = redis.call('HMGET', KEYS[1], FIELD.admit_token, FIELD.status)
if held[1] == ARGV[1] and held[2] == STATUS.admitting then
  return redis.call('DEL', KEYS[1])
end
return 0

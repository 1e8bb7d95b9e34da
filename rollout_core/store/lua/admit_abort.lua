-- Forget a failed admission so a retry with the same key starts afresh.
-- KEYS: record   ARGV: admit_token
if redis.call('HGET', KEYS[1], FIELD.admit_token) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

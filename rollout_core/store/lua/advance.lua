-- Move a rollout on (to a later status, terminal or not); only its lease holder may.
-- Terminal statuses go through terminate().
-- KEYS: record
-- ARGV: execution, status, result ('' keeps the stored one), ttl_ms, field, value, ...
-- -> 1, or 0 when this execution no longer holds the rollout (its result is discarded)
local fields = redis.call('HMGET', KEYS[1], FIELD.execution, FIELD.status)
if fields[1] ~= ARGV[1] or not HELD[fields[2]] then
  return 0
end
if #ARGV > 4 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 5))
end
if TERMINAL[ARGV[2]] then
  terminate(KEYS[1], ARGV[2], ARGV[3], ARGV[4])
  return 1
end
redis.call('HSET', KEYS[1], FIELD.status, ARGV[2])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], FIELD.result, ARGV[3])
end
redis.call('PUBLISH', CHANGES, KEYS[1])
return 1

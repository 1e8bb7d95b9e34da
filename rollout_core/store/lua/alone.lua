-- A worker runs the rollout with no other rollout beside it: a crash from now on is its own.
-- KEYS: record   ARGV: execution
-- -> 1 marked, 0 not (the lease is this execution's no more)
local fields = redis.call('HMGET', KEYS[1], FIELD.execution, FIELD.status)
if fields[1] ~= ARGV[1] or not LEASED[fields[2]] then
  return 0
end
redis.call('HSET', KEYS[1], FIELD.alone, ARGV[1])
return 1

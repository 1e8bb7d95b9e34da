-- Move a rollout on; only its lease owner may. Terminal statuses go through terminate().
-- KEYS: record
-- ARGV: owner, status, result ('' keeps the stored one), ttl_ms, field, value, ...
-- -> 1, or 0 when this worker no longer owns the rollout (its result is discarded)
local fields = redis.call('HMGET', KEYS[1], 'owner', 'status')
if fields[1] ~= ARGV[1] or not is_held(fields[2]) then
  return 0
end
if #ARGV > 4 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 5))
end
if is_terminal(ARGV[2]) then
  terminate(KEYS[1], ARGV[2], ARGV[3], ARGV[4])
  return 1
end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'result', ARGV[3])
end
redis.call('PUBLISH', CHANGES, KEYS[1])
return 1

-- Extend the leases a worker's executions still hold; report the ones they lost.
-- KEYS: record...   ARGV: lease_ms, inflight_ttl_ms, execution... (one per record, same order;
--                   a record may appear twice: a stale execution besides a reclaim)
-- -> the executions whose lease is gone
local now = now_ms()
local lost = {}
for i = 1, #KEYS do
  local execution = ARGV[i + 2]
  local fields = redis.call('HMGET', KEYS[i], FIELD.execution, FIELD.status)
  if fields[1] == execution and HELD[fields[2]] then
    redis.call('ZADD', LEASES, now + tonumber(ARGV[1]), KEYS[i])
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    lost[#lost + 1] = execution
  end
end
return lost

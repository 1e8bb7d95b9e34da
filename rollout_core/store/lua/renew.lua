-- Extend the leases a worker's executions still hold; report the ones they lost, and the
-- ones whose cancellation was requested (a stop published while the worker was not
-- listening, or before the execution was registered, is not missed: pub/sub is only the
-- fast path).
-- KEYS: record...   ARGV: lease_ms, inflight_ttl_ms, execution... (one per record, same order;
--                   a record may appear twice: a stale execution besides a reclaim)
-- -> {lost executions, executions to stop}
local now = now_ms()
local lost, stop = {}, {}
for i = 1, #KEYS do
  local execution = ARGV[i + 2]
  local fields = redis.call('HMGET', KEYS[i], FIELD.execution, FIELD.status,
                            FIELD.cancel_requested)
  if fields[1] == execution and LEASED[fields[2]] then
    redis.call('ZADD', LEASES, now + tonumber(ARGV[1]), KEYS[i])
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    if fields[3] and fields[2] ~= STATUS.delivering then
      stop[#stop + 1] = execution
    end
  else
    lost[#lost + 1] = execution
  end
end
return {lost, stop}

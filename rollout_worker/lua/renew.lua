-- Extend the leases a worker still holds; report the ones it lost.
-- KEYS: record...   ARGV: owner, lease_ms, inflight_ttl_ms
-- -> the record keys whose lease is no longer this owner's
local now = now_ms()
local lost = {}
for i = 1, #KEYS do
  local fields = redis.call('HMGET', KEYS[i], 'owner', 'status')
  if fields[1] == ARGV[1] and is_held(fields[2]) then
    redis.call('ZADD', LEASES, now + tonumber(ARGV[2]), KEYS[i])
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  else
    lost[#lost + 1] = KEYS[i]
  end
end
return lost

-- A worker takes a rollout: only if it is queued, or its previous holder's lease lapsed.
-- KEYS: record, leases   ARGV: owner, lease_ms, max_attempts
-- -> {'missing'} | {'done'} | {'busy'} | {verdict, attempt, ms_since_accepted, field, value, ...}
--    verdict: 'running' (run the agent), 'delivering' (a result awaits delivery),
--             'exhausted' (too many attempts: fail it)
local now = now_ms()
local fields = redis.call('HMGET', KEYS[1], 'status', 'accepted_at')
local status = fields[1]
if not status or status == 'admitting' then
  return {'missing'}
end
if is_terminal(status) then
  return {'done'}
end
if status ~= 'queued' then
  local expiry = redis.call('ZSCORE', KEYS[2], KEYS[1])
  if expiry and tonumber(expiry) > now then
    return {'busy'}
  end
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local phase = 'running'
if status == 'delivering' then
  phase = 'delivering'
end
redis.call('HSET', KEYS[1], 'status', phase, 'owner', ARGV[1], 'worker', ARGV[1], 'claimed_at', now)
redis.call('HSETNX', KEYS[1], 'started_at', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), KEYS[1])
local verdict = phase
if attempt > tonumber(ARGV[3]) then
  verdict = 'exhausted'
end
return {verdict, attempt, now - tonumber(fields[2] or now), unpack(redis.call('HGETALL', KEYS[1]))}

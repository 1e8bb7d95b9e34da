-- A worker takes a rollout: only if it is queued, or its previous holder's lease lapsed.
-- KEYS: record   ARGV: owner (this execution's lease), worker (its process), lease_ms, max_attempts
-- -> {'missing'} | {'done'} | {'busy'} | {verdict, attempt, ms_since_accepted, field, value, ...}
--    verdict: 'running' (run it), 'delivering' (a stored result awaits delivery),
--             'cancelled' (cancel was requested), 'exhausted' (too many attempts: fail it),
--             'abandoned' (a worker gave it up, its reason in the record: fail it)
local now = now_ms()
local fields = redis.call(
  'HMGET', KEYS[1], 'status', 'accepted_at', 'cancel_requested', 'abandon_reason')
local status = fields[1]
if not status or status == 'admitting' then
  return {'missing'}
end
if is_terminal(status) then
  return {'done'}
end
if status ~= 'queued' then
  local expiry = redis.call('ZSCORE', LEASES, KEYS[1])
  if expiry and tonumber(expiry) > now then
    return {'busy'}
  end
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local phase = 'running'
if status == 'delivering' then
  phase = 'delivering'
end
redis.call('HSET', KEYS[1], 'status', phase, 'owner', ARGV[1], 'worker', ARGV[2], 'claimed_at', now)
redis.call('HSETNX', KEYS[1], 'started_at', now)
redis.call('ZADD', LEASES, now + tonumber(ARGV[3]), KEYS[1])
if status ~= phase then
  redis.call('PUBLISH', CHANGES, KEYS[1])
end
local verdict = phase
if fields[3] and phase == 'running' then
  verdict = 'cancelled'
elseif fields[4] and phase == 'running' then
  verdict = 'abandoned'
elseif attempt > tonumber(ARGV[4]) then
  verdict = 'exhausted'
end
return {verdict, attempt, now - tonumber(fields[2] or now), unpack(redis.call('HGETALL', KEYS[1]))}

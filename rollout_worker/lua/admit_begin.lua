-- Start admitting a rollout, or report what is known about it.
-- KEYS: record   ARGV: admit_token, pending_ttl_ms
-- -> {'lead'} | {'wait'} (another admission is in progress) | {'replay', response}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  redis.call('HSET', KEYS[1], 'status', 'admitting', 'admit_token', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'lead'}
end
if status == 'admitting' then
  return {'wait'}
end
return {'replay', redis.call('HGET', KEYS[1], 'response')}

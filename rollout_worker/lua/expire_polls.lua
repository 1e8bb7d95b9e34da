-- Finish v2 rollouts nobody polled in time (trainer gone) and stop their execution.
-- ARGV: limit, ttl_ms   -> how many expired
local now = now_ms()
local overdue = redis.call('ZRANGEBYSCORE', POLLS, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local expired = 0
for _, record in ipairs(overdue) do
  local status = redis.call('HGET', record, 'status')
  redis.call('ZREM', POLLS, record)
  if status and not is_terminal(status) then
    terminate(record, 'failure', v2_result(record, 'failure', 'polling lease expired', 'lease_expired'), ARGV[2])
    redis.call('PUBLISH', STOPS, record)
    expired = expired + 1
  end
end
return expired

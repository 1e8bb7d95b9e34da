-- A rollout waiting for a worker whose message was lost on its way to one (taken from the
-- queue, never recorded as unacked: a crash or a broken connection inside kombu) gets a new
-- message — at most once per guard period, however many sweepers find it.
-- KEYS: record, queue   ARGV: message, guard_ms
-- -> 1 resent, 0 nothing to do (it started since, or was resent lately)
local status = redis.call('HGET', KEYS[1], FIELD.status)
if not WAITING[status] or redis.call('ZSCORE', LEASES, KEYS[1]) then
  return 0
end
local now = now_ms()
if tonumber(redis.call('HGET', KEYS[1], FIELD.resent_at) or '0') > now - tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], FIELD.resent_at, now)
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1

-- Admit a v2 rollout, checks in the protocol's order: draining, capacity, duplicate.
-- KEYS: record, queue
-- ARGV: max_queued, polling_lease_ms, ttl_ms, record_id, message, lease_digest, field, value, ...
-- -> ADMIT.draining | ADMIT.full | ADMIT.duplicate | ADMIT.queued
-- The same admission sent again (a client retrying after its connection to Redis broke, the
-- first reply lost) carries the same lease digest: it is answered ADMIT.queued again. So is a
-- retry of an admission whose replicas never confirmed it (answered 503): it takes the
-- rollout over with its own lease digest, if it asks for the same rollout (the stored request
-- is the one that runs: another trainer's admission of the id must not get its result). Either
-- way the digest is written, so the WAIT after the script confirms the record reached the
-- replicas before the trainer hears 202.
local held = redis.call('HMGET', KEYS[1], FIELD.status, FIELD.lease_digest, FIELD.unconfirmed,
                        FIELD.request)
local digest = held[2]
local function same_request()
  for i = 7, #ARGV - 1, 2 do
    if ARGV[i] == FIELD.request then
      return held[4] == ARGV[i + 1]
    end
  end
  return false
end
if digest == ARGV[6] or (digest and held[3] and same_request()) then
  redis.call('HSET', KEYS[1], FIELD.lease_digest, ARGV[6])
  return ADMIT.queued
end
if redis.call('EXISTS', DRAINING) == 1 then
  return ADMIT.draining
end
if redis.call('LLEN', KEYS[2]) >= tonumber(ARGV[1]) then
  return ADMIT.full
end
if held[1] then
  return ADMIT.duplicate
end
local now = polling_now()
local deadline = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], FIELD.status, STATUS.queued, FIELD.accepted_at, now, FIELD.attempt, 0,
           FIELD.lease_digest, ARGV[6], unpack(ARGV, 7))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', ACTIVE, now, KEYS[1])
redis.call('ZADD', POLLING_LEASES, deadline, KEYS[1])
redis.call('ZADD', V2IDS, 0, ARGV[4])
redis.call('LPUSH', KEYS[2], ARGV[5])
return ADMIT.queued

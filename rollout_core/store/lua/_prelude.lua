-- Shared by every script, after the generated names (schema.py). Time is Redis's, so leases
-- do not depend on the clocks of the hosts that hold them.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Tell the long-polls watching the record its new status (the message's format: schema.py).
local function publish_change(record, status)
  redis.call('PUBLISH', CHANGES, status .. CHANGE_SEPARATOR .. record)
end
-- Whether the record's entry in a time index (LEASES, POLLS) is there and its time has come
-- (by ``now`` if the caller read the clock already).
local function due(index, record, now)
  local at = redis.call('ZSCORE', index, record)
  return at ~= false and tonumber(at) <= (now or now_ms())
end
-- Make a record terminal: result stored, secret and lease dropped, retention TTL started.
-- FIELD.terminations counts the calls: anything but 1 is a bug (the chaos suite checks it).
local function terminate(record, status, result, ttl_ms)
  local now = now_ms()
  if result ~= '' then
    redis.call('HSET', record, FIELD.status, status, FIELD.finished_at, now, FIELD.result, result)
  else
    redis.call('HSET', record, FIELD.status, status, FIELD.finished_at, now)
  end
  redis.call('HINCRBY', record, FIELD.terminations, 1)
  redis.call('HDEL', record, FIELD.secret, FIELD.execution)
  redis.call('ZREM', LEASES, record)
  redis.call('ZREM', ACTIVE, record)
  redis.call('ZREM', POLLS, record)
  redis.call('ZADD', FINISHED, now + tonumber(ttl_ms), record)
  redis.call('PEXPIRE', record, ttl_ms)
  publish_change(record, status)
end

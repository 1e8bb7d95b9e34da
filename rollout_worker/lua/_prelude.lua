-- Shared by every script; records.py fills in PREFIX when it registers them. Time is Redis's,
-- so leases do not depend on the clocks of the hosts that hold them.
local PREFIX = '{prefix}'
local LEASES = PREFIX .. ':leases'         -- record -> worker lease expiry (ms)
local ACTIVE = PREFIX .. ':active'         -- record -> admission time, while unfinished
local FINISHED = PREFIX .. ':finished'     -- record -> retention expiry, once finished
local POLLS = PREFIX .. ':poll-leases'     -- v2 record -> trainer's polling deadline (ms)
local V2IDS = PREFIX .. ':v2-ids'          -- v2 rollout ids (lexical, for prefix cancels)
local DRAINING = PREFIX .. ':draining'     -- set: admissions are fenced
local CHANGES = PREFIX .. ':changes'       -- channel: a record's status changed
local STOPS = PREFIX .. ':stops'           -- channel: stop executing a record

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function is_terminal(status)
  return status == 'success' or status == 'failure' or status == 'cancelled'
end
local function is_held(status)
  return status == 'running' or status == 'grading' or status == 'delivering'
end
local function rollout_id(record)
  return string.sub(record, string.len(PREFIX) + 5)  -- '<prefix>:v2:<id>' -> '<id>'
end
local function v2_result(record, status, message, category)
  return cjson.encode({rollout_id = rollout_id(record), status = status, sample = cjson.null,
                       err_message = message or cjson.null, err_category = category or cjson.null})
end
-- Make a record terminal: result stored, secret and lease dropped, retention TTL started.
-- 'terminations' counts the calls: anything but 1 is a bug (the chaos suite checks it).
local function terminate(record, status, result, ttl_ms)
  local now = now_ms()
  redis.call('HSET', record, 'status', status, 'finished_at', now)
  redis.call('HINCRBY', record, 'terminations', 1)
  if result ~= '' then
    redis.call('HSET', record, 'result', result)
  end
  redis.call('HDEL', record, 'secret', 'owner')
  redis.call('ZREM', LEASES, record)
  redis.call('ZREM', ACTIVE, record)
  redis.call('ZREM', POLLS, record)
  redis.call('ZADD', FINISHED, now + tonumber(ttl_ms), record)
  redis.call('PEXPIRE', record, ttl_ms)
  redis.call('PUBLISH', CHANGES, record)
end

-- Shared by every script, after the generated names (schema.py). Time is Redis's, so leases
-- do not depend on the clocks of the hosts that hold them.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whether the record's entry in a time index (LEASES, POLLING_LEASES) is there and its time
-- has come (by ``now`` if the caller read the clock already).
local function due(index, record, now)
  local at = redis.call('ZSCORE', index, record)
  return at ~= false and tonumber(at) <= (now or now_ms())
end
-- Now (ms), on the clock polling deadlines (POLLING_LEASES) run on: time the fleet's Redis
-- could not answer does not count against a trainer's polling lease (P§2.7), since every
-- poll failed then. Every fleet process ticks every second (CLOCK_FIELD.tick = now), and so does every
-- script that reads or sets a polling deadline. One that finds the last tick older than
-- POLLING_CLOCK_GAP_MS knows no fleet process reached Redis since (it was stopped, restarting,
-- loading its AOF, failing over, or cut off from all of them), whoever saw it and whoever did
-- not: it moves every deadline that was still running at the last tick on by the whole gap,
-- once (the tick it writes closes the gap). A deadline past at the last tick stays past.
-- A tick is written only once the last is POLLING_CLOCK_RESOLUTION_MS old (or ahead of the
-- clock): a busy fleet's polls do not each add a write to the AOF and the replicas.
local function polling_now()
  local now = now_ms()
  local stored = redis.call('HGET', CLOCK, CLOCK_FIELD.tick)
  local last = tonumber(stored or now)
  local gap = now - last
  if gap > POLLING_CLOCK_GAP_MS then
    local running = redis.call('ZRANGEBYSCORE', POLLING_LEASES, '(' .. last, '+inf', 'WITHSCORES')
    for i = 1, #running, 2 do
      redis.call('ZADD', POLLING_LEASES, tonumber(running[i + 1]) + gap, running[i])
    end
    redis.call('HSET', CLOCK, CLOCK_FIELD.away_ms, gap, CLOCK_FIELD.away_at, now)
    redis.call('HINCRBY', CLOCK, CLOCK_FIELD.outages, 1)
  end
  if not stored or gap >= POLLING_CLOCK_RESOLUTION_MS or gap < 0 then
    redis.call('HSET', CLOCK, CLOCK_FIELD.tick, now)
  end
  return now
end
-- Whether a record is a v2 rollout's (only those have a polling lease and a v2-ids entry).
local function is_v2(record)
  return string.sub(record, 1, string.len(V2_RECORDS)) == V2_RECORDS
end
-- Give a v1 record's alias (schema.py) the record's own TTL, if the alias still names it
-- (a newer admission of the rollout id may have taken it); `ttl_ms` 0 deletes it.
local function follow_alias(record, ttl_ms)
  local id = redis.call('HGET', record, FIELD.rollout_id)
  if not id then
    return
  end
  local alias = V1_ALIASES .. id
  if redis.call('GET', alias) == record then
    if tonumber(ttl_ms) > 0 then
      redis.call('PEXPIRE', alias, ttl_ms)
    else
      redis.call('DEL', alias)
    end
  end
end
-- Tell the long-polls watching the record its new status (the message's format: schema.py).
-- Only v2 has long-polls (P§2.4): a v1 record's changes have no reader and are not published.
local function publish_change(record, status)
  if is_v2(record) then
    redis.call('PUBLISH', CHANGES, status .. CHANGE_SEPARATOR .. record)
  end
end
-- Count what finishing `record` added (its result, whenever it was written; the `writes` of
-- its end; FINISH_OVERHEAD_BYTES) into the fleet's running mean, MEMORY_FIELD.finish_bytes:
-- gateways keep that much room for every unfinished rollout to finish (schema.py).
local function count_finish_bytes(record, writes)
  local added = FINISH_OVERHEAD_BYTES + redis.call('HSTRLEN', record, FIELD.result)
  for _, item in ipairs(writes) do
    added = added + string.len(item)
  end
  local mean = tonumber(redis.call('HGET', MEMORY, MEMORY_FIELD.finish_bytes) or added)
  redis.call('HSET', MEMORY, MEMORY_FIELD.finish_bytes,
             string.format('%.1f', mean + (added - mean) / FINISH_BYTES_WEIGHT))
end
-- Make a record terminal in one write: status, result (unless ''), the caller's `fields`
-- (field, value, ...); secret and lease holder emptied, retention TTL started.
-- FIELD.terminations counts the calls: anything but 1 is a bug (the chaos suite checks it). A
-- caller that read the record already passes the count it found (`terminations`, 0 if none).
local function terminate(record, status, result, ttl_ms, fields, terminations)
  local now = now_ms()
  terminations = terminations or tonumber(redis.call('HGET', record, FIELD.terminations) or 0)
  local writes = {}
  for _, item in ipairs(fields or {}) do
    writes[#writes + 1] = item
  end
  -- The secret and the lease holder are emptied in the same write (an HDEL more otherwise):
  -- an empty one is none (RolloutRecord reads it so; no execution id is empty).
  for _, item in ipairs({FIELD.status, status, FIELD.finished_at, now,
                         FIELD.terminations, terminations + 1,
                         FIELD.secret, '', FIELD.execution, ''}) do
    writes[#writes + 1] = item
  end
  if result ~= '' then
    writes[#writes + 1], writes[#writes + 2] = FIELD.result, result
  end
  redis.call('HSET', record, unpack(writes))
  count_finish_bytes(record, writes)
  redis.call('ZREM', LEASES, record)
  redis.call('ZREM', ACTIVE, record)
  if is_v2(record) then
    redis.call('ZREM', POLLING_LEASES, record)
  end
  redis.call('ZADD', FINISHED, now + tonumber(ttl_ms), record)
  redis.call('PEXPIRE', record, ttl_ms)
  if not is_v2(record) then
    follow_alias(record, ttl_ms)
  end
  publish_change(record, status)
end
-- Its worker stopped renewing the rollout's lease while running it (crashed, killed, frozen):
-- the crash counts against its attempts only if it ran alone there (FIELD.alone names that
-- execution). Otherwise the crash may have been another rollout's (an agent that kills its
-- worker takes every rollout on it down), and it is forgiven - at most max_attempts +
-- ALONE_AFTER_FORGIVEN times, so a rollout's runs stay bounded. Workers run a rollout forgiven
-- ALONE_AFTER_FORGIVEN times alone (rollout_worker/execution.py).
local function forgive_shared_crash(record, max_attempts)
  local fields = redis.call('HMGET', record, FIELD.execution, FIELD.alone, FIELD.forgiven)
  local forgiven = tonumber(fields[3] or 0)
  local most = tonumber(max_attempts) + ALONE_AFTER_FORGIVEN
  if fields[1] and fields[1] ~= fields[2] and forgiven < most then
    redis.call('HINCRBY', record, FIELD.forgiven, 1)
    return forgiven + 1
  end
  return forgiven
end

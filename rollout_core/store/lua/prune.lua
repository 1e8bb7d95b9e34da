-- Drop index entries of records whose TTL ran out, and keep waiting rollouts alive: a record
-- admitted longer ago than half the in-flight TTL that still waits (a long backlog) gets a
-- fresh TTL, so no admitted rollout expires before a worker takes it.
-- ARGV: inflight_ttl_ms, batch
local now = now_ms()
for _, record in ipairs(redis.call('ZRANGEBYSCORE', FINISHED, '-inf', now)) do
  -- An id admitted again after eviction keeps its index entry.
  if is_v2(record) and redis.call('EXISTS', record) == 0 then
    redis.call('ZREM', V2IDS, string.sub(record, string.len(V2_RECORDS) + 1))
  end
end
redis.call('ZREMRANGEBYSCORE', FINISHED, '-inf', now)
local ttl = tonumber(ARGV[1])
local aging = redis.call('ZRANGEBYSCORE', ACTIVE, '-inf', now - ttl / 2, 'LIMIT', 0, ARGV[2])
for _, record in ipairs(aging) do
  local status = redis.call('HGET', record, FIELD.status)
  if status and not TERMINAL[status] then
    redis.call('PEXPIRE', record, ttl)
    if not is_v2(record) then
      follow_alias(record, ttl)
    end
    redis.call('ZADD', ACTIVE, now, record)
  else
    redis.call('ZREM', ACTIVE, record)
  end
end
return 1

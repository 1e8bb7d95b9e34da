-- Drop index entries of records whose TTL ran out.
-- ARGV: inflight_ttl_ms
local now = now_ms()
for _, record in ipairs(redis.call('ZRANGEBYSCORE', FINISHED, '-inf', now)) do
  -- An id admitted again after eviction keeps its index entry.
  local is_v2 = string.sub(record, 1, string.len(V2_RECORDS)) == V2_RECORDS
  if is_v2 and redis.call('EXISTS', record) == 0 then
    redis.call('ZREM', V2IDS, string.sub(record, string.len(V2_RECORDS) + 1))
  end
end
redis.call('ZREMRANGEBYSCORE', FINISHED, '-inf', now)
redis.call('ZREMRANGEBYSCORE', ACTIVE, '-inf', now - tonumber(ARGV[1]))
return 1

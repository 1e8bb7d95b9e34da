-- A write that changes nothing (the record's TTL set to what it is): the WAIT after it, on the
-- same connection, confirms that every earlier write of the record reached the replicas
-- (WAIT counts this connection's writes; replication keeps their order). Before a trainer is
-- told what the record holds: a replayed admission, a final result.
-- KEYS: record   -> 1, or 0 if the record is gone or has no TTL
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1

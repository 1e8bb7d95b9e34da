-- Read a record's fields in a write that changes nothing (its TTL set to what it is): the WAIT
-- the store sends after it, on the same connection, then covers what this read (WAIT counts
-- this connection's writes; replication keeps their order). What a trainer is told of a
-- record — a replayed admission, a final result — is this reply, never an earlier read: after
-- a failover between the two, a WAIT would confirm the new primary's record, not the one read.
-- KEYS: record   ARGV: fields   -> their values; {} if the record is gone or has no TTL
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return {}
end
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('HMGET', KEYS[1], unpack(ARGV))

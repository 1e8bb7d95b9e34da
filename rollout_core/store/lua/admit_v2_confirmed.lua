-- The replicas confirmed a v2 admission: a retry may no longer take the rollout over.
-- KEYS: record
-- ARGV: lease_digest (the admission's own: a retry that took the rollout over meanwhile
--       confirms its own admission)
-- -> 1 if the record was marked confirmed, else 0
if redis.call('HGET', KEYS[1], FIELD.lease_digest) ~= ARGV[1] then
  return 0
end
return redis.call('HDEL', KEYS[1], FIELD.unconfirmed)

-- A v1 admission answered again from its record (the trainer retried): counted. The write
-- is what lets the WAIT after it confirm that the record reached the replicas (WAIT counts
-- this connection's writes), before the trainer hears 202 again.
-- KEYS: record   -> 1, or 0 if the record is gone
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], FIELD.replays, 1)
return 1

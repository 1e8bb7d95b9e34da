-- Shared by every script (prepended by records.py). Time is Redis's, so leases do not
-- depend on the clocks of the hosts that take them.
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

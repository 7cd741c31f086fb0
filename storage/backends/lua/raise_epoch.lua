-- Raise a task's epoch to at least ARGV[1]; never lowers it, so a retried call is harmless.
-- KEYS: 1 epoch
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if wanted > current then
  redis.call('SET', KEYS[1], ARGV[1])
  return wanted
end
return current

-- Raise a task's epoch to at least ARGV[1]; never lowers it, so a retried call is harmless.
-- KEYS: 1 epoch, 2 owner, 3 audit stream
-- ARGV: 1 epoch wanted, 2 owner token or "" (a person, not a coordinator), 3 audit "1"/"0"
-- A coordinator that lost the task to a newer one is refused: raising the epoch would
-- fence the new owner's running steps.
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return redis.error_reply('FENCED coordinator token ' .. ARGV[2] .. ' no longer owns the task')
end
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if wanted > current then
  redis.call('SET', KEYS[1], ARGV[1])
  if ARGV[3] == '1' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', '100000', '*', 'kind', 'epoch', 'at', ARGV[1])
  end
  return wanted
end
return current

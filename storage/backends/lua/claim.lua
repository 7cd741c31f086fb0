-- A coordinator takes a task: the task's owner token only rises, so one holding an older
-- lease (paused past it, then resumed) is refused from then on.
-- KEYS: 1 owner; ARGV: 1 the coordinator's lease token
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if current > token then
  return redis.error_reply('FENCED task is owned by coordinator token ' .. current)
end
redis.call('SET', KEYS[1], ARGV[1])
return token

-- Make (epoch, superstep, attempt) the only attempt of an agent allowed to write LCs.
-- KEYS: 1 attempts, 2 epoch, 3 audit stream
-- ARGV: 1 agent, 2 superstep, 3 attempt, 4 audit "1"/"0", 5 the caller's epoch or ""
-- A caller acting for an epoch that is no longer current (a coordinator retrying a step
-- while a restore raised the epoch) is refused: its fence would block the restore's own.
-- It only moves forward: a stale coordinator (or a retried call) can never hand a step
-- back to an older attempt, whose zombie would then be able to write again.
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= epoch then
  return redis.error_reply('FENCED stale epoch ' .. ARGV[5] .. ' (task is at ' .. epoch .. ')')
end
local wanted = epoch .. ':' .. ARGV[2] .. ':' .. ARGV[3]
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local e, s, a = string.match(current, '^(%d+):(%d+):(%d+)$')
  e, s, a = tonumber(e), tonumber(s), tonumber(a)
  local ns, na = tonumber(ARGV[2]), tonumber(ARGV[3])
  if e > epoch or (e == epoch and (s > ns or (s == ns and a > na))) then
    return redis.error_reply('FENCED attempt ' .. wanted .. ' is older than ' .. current)
  end
end
redis.call('HSET', KEYS[1], ARGV[1], wanted)
if ARGV[4] == '1' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '100000', '*', 'kind', 'fence', 'agent', ARGV[1],
    'at', wanted)
end
return wanted

-- Fenced write of a spawned member's first LC, by the step that spawned it (before its vote).
-- KEYS: 1 epoch, 2 attempts, 3 lc, 4 tentative LCs of the superstep, 5 audit stream
-- ARGV: 1 epoch, 2 spawner, 3 the spawner's "epoch:superstep:attempt", 4 member, 5 lc id,
--       6 checksum, 7 sealed bytes, 8 level, 9 audit "1"/"0"
-- Fenced by the spawner's attempt, as the spawner's own LC is: a zombie spawner writes
-- nothing. The member has no attempt yet (the next superstep's begin fences its first
-- step). The same LC written twice is a no-op (redis-py retries commands whose reply it
-- lost). A first LC is full and rests on nothing: its tentative entry names no parent.
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[1] then
  return redis.error_reply('FENCED stale epoch ' .. ARGV[1] .. ' (task is at ' .. (epoch or 'none') .. ')')
end
local current = redis.call('HGET', KEYS[2], ARGV[2])
if current ~= ARGV[3] then
  return redis.error_reply('FENCED stale attempt ' .. ARGV[3] .. ' (current ' .. (current or 'none') .. ')')
end
local existing = redis.call('HGET', KEYS[3], 'sum')
if existing then
  if existing ~= ARGV[6] then
    return redis.error_reply('FENCED LC ' .. ARGV[5] .. ' exists with another checksum')
  end
  return 'OK'
end
redis.call('HSET', KEYS[3], 'data', ARGV[7], 'sum', ARGV[6], 'agent', ARGV[4],
  'parent', '', 'full', '1', 'level', ARGV[8])
redis.call('HSET', KEYS[4], ARGV[5], '\t' .. ARGV[6] .. '\t' .. ARGV[4])
if ARGV[9] == '1' then
  -- The write is the spawner's, under its fence; `member` says whose LC it is.
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', '100000', '*', 'kind', 'lc', 'agent', ARGV[2],
    'at', ARGV[3], 'lc', ARGV[5], 'member', ARGV[4])
end
return 'OK'

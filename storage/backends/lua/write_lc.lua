-- Fenced write of a local checkpoint (and its vote), the prepare phase of the 2PC.
-- KEYS: 1 epoch, 2 attempts, 3 lc, 4 tentative LCs of the superstep, 5 votes, 6 progress,
--       7 audit stream, 8 blob times, 9.. the blobs the LC's change set adds
-- ARGV: 1 epoch, 2 agent, 3 "epoch:superstep:attempt", 4 lc id, 5 checksum, 6 sealed bytes,
--       7 parent id or "", 8 full "1"/"0", 9 level, 10 vote "1"/"0", 11 audit "1"/"0",
--       12 now (Unix seconds), 13.. each blob's address, then its sealed bytes (KEYS order)
-- A stale epoch or attempt is refused (a zombie cannot write); the same LC written twice
-- is a no-op, because redis-py retries commands whose reply it lost. Blobs are put as
-- put_blob puts them: once under their address, their time refreshed.
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
  if existing ~= ARGV[5] then
    return redis.error_reply('FENCED LC ' .. ARGV[4] .. ' exists with another checksum')
  end
else
  redis.call('HSET', KEYS[3], 'data', ARGV[6], 'sum', ARGV[5], 'agent', ARGV[2],
    'parent', ARGV[7], 'full', ARGV[8], 'level', ARGV[9])
  -- id → "parent\tchecksum\tagent": what the commit checks a member against and walks
  -- chains in, never reading the LCs themselves. The parent is named only when it is
  -- tentative too (a step LC of this superstep): an LC of an earlier superstep never
  -- joins this hash later, so "" ends the walk as surely, and spares it a lookup.
  local parent = ''
  if ARGV[8] ~= '1' and ARGV[7] ~= '' and redis.call('HEXISTS', KEYS[4], ARGV[7]) == 1 then
    parent = ARGV[7]
  end
  redis.call('HSET', KEYS[4], ARGV[4], parent .. '\t' .. ARGV[5] .. '\t' .. ARGV[2])
end
for i = 9, #KEYS do
  local at = 2 * i - 5
  redis.call('SET', KEYS[i], ARGV[at + 1], 'NX')
  redis.call('ZADD', KEYS[8], ARGV[12], ARGV[at])
end
-- A retry of this step resumes from the latest tool-level LC an earlier attempt wrote.
if ARGV[9] == 'tool' then
  redis.call('HSET', KEYS[6], ARGV[2], ARGV[4] .. ' ' .. ARGV[5])
end
if ARGV[10] == '1' then
  redis.call('HSET', KEYS[5], ARGV[2], ARGV[4] .. ' ' .. ARGV[5])
end
if ARGV[11] == '1' then
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', '100000', '*', 'kind', 'lc', 'agent', ARGV[2],
    'at', ARGV[3], 'lc', ARGV[4])
end
return 'OK'

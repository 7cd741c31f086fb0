-- Commit a global checkpoint: the single write that is the commit point of the 2PC.
-- KEYS: 1 epoch, 2 gc, 3 gcs, 4 latest, 5 workspace manifest blob, 6 superstep set,
--       7 votes, 8 progress, 9 owner, 10.. one lc key per member
-- ARGV: 1 number, 2 epoch, 3 sealed bytes, 4 checksum, 5 superstep, 6 lc key prefix,
--       7 owner token or "", 8.. (agent, checksum) per member, in the order of KEYS 10..
-- Every check runs before the first write, so a refused commit writes nothing.
if ARGV[7] ~= '' and redis.call('GET', KEYS[9]) ~= ARGV[7] then
  return redis.error_reply('REFUSED coordinator token ' .. ARGV[7] .. ' no longer owns the task')
end
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[2] then
  return redis.error_reply('REFUSED stale epoch ' .. ARGV[2] .. ' (task is at ' .. (epoch or 'none') .. ')')
end
local status = redis.call('HGET', KEYS[2], 'status')
if status == 'COMMITTED' then
  if redis.call('HGET', KEYS[2], 'sum') == ARGV[4] then return 'EXISTS' end
  return redis.error_reply('REFUSED GC ' .. ARGV[1] .. ' is already committed')
end
if status == 'ABORTED' then
  return redis.error_reply('REFUSED GC ' .. ARGV[1] .. ' was aborted')
end
if redis.call('EXISTS', KEYS[5]) == 0 then
  return redis.error_reply('REFUSED workspace manifest ' .. KEYS[5] .. ' is not stored')
end
local members = #KEYS - 9
for i = 1, members do
  local agent = ARGV[6 + 2 * i]
  local sum = ARGV[7 + 2 * i]
  local f = redis.call('HMGET', KEYS[9 + i], 'sum', 'agent')
  if not f[1] then
    return redis.error_reply('REFUSED LC ' .. KEYS[9 + i] .. ' of ' .. agent .. ' is missing')
  end
  if f[1] ~= sum or f[2] ~= agent then
    return redis.error_reply('REFUSED LC ' .. KEYS[9 + i] .. ' of ' .. agent .. ' does not match its vote')
  end
end
redis.call('HSET', KEYS[2], 'data', ARGV[3], 'sum', ARGV[4], 'status', 'COMMITTED', 'superstep', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
-- An LC is tentative while its id is in its superstep's set; deleting the set below makes
-- every LC it keeps committed. Keep each member and, when an agent wrote several step LCs
-- in this superstep, the ancestors its delta rests on; drop the rest (tool-level LCs,
-- refused retries). A member carried over from an earlier superstep is not in the set.
local tentative = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[6])) do tentative[id] = true end
local prefix = #ARGV[6]
for i = 1, members do
  local id = string.sub(KEYS[9 + i], prefix + 1)
  while id and tentative[id] do
    tentative[id] = nil
    local f = redis.call('HMGET', ARGV[6] .. id, 'parent', 'full')
    if f[2] == '1' or not f[1] or f[1] == '' then break end
    id = f[1]
  end
end
for id in pairs(tentative) do redis.call('DEL', ARGV[6] .. id) end
redis.call('DEL', KEYS[6], KEYS[7], KEYS[8])
local latest = tonumber(redis.call('GET', KEYS[4]) or '-1')
if tonumber(ARGV[1]) > latest then redis.call('SET', KEYS[4], ARGV[1]) end
return 'OK'

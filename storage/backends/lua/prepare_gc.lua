-- Record a PREPARING global checkpoint; refused once the GC is decided.
-- KEYS: 1 epoch, 2 gc, 3 gcs, 4 owner
-- ARGV: 1 number, 2 epoch, 3 sealed bytes, 4 checksum, 5 superstep, 6 owner token or ""
if ARGV[6] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[6] then
  return redis.error_reply('FENCED coordinator token ' .. ARGV[6] .. ' no longer owns the task')
end
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[2] then
  return redis.error_reply('FENCED stale epoch ' .. ARGV[2] .. ' (task is at ' .. (epoch or 'none') .. ')')
end
local status = redis.call('HGET', KEYS[2], 'status')
if status and status ~= 'PREPARING' then
  return redis.error_reply('REFUSED GC ' .. ARGV[1] .. ' is already ' .. status)
end
redis.call('HSET', KEYS[2], 'data', ARGV[3], 'sum', ARGV[4], 'status', 'PREPARING', 'superstep', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
return 'OK'

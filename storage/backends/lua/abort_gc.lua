-- Abort a global checkpoint: mark it ABORTED, drop the superstep's tentative LCs and votes.
-- KEYS: 1 gc, 2 gcs, 3 tentative LCs of the superstep, 4 votes, 5 progress, 6 owner
-- ARGV: 1 number, 2 sealed bytes, 3 checksum, 4 superstep, 5 lc key prefix,
--       6 owner token or "" (a coordinator's write is refused once a newer one owns the task)
local CHUNK = 1000 -- keys per DEL: unpack() is bounded by Lua's C stack
if ARGV[6] ~= '' and redis.call('GET', KEYS[6]) ~= ARGV[6] then
  return redis.error_reply('FENCED coordinator token ' .. ARGV[6] .. ' no longer owns the task')
end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'COMMITTED' then
  return redis.error_reply('REFUSED GC ' .. ARGV[1] .. ' is committed and cannot be aborted')
end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'sum', ARGV[3], 'status', 'ABORTED', 'superstep', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1])
-- Every LC still in the superstep's hash is tentative: a commit deletes the hash.
local doomed = redis.call('HKEYS', KEYS[3])
for i = 1, #doomed do doomed[i] = ARGV[5] .. doomed[i] end
for first = 1, #doomed, CHUNK do
  redis.call('DEL', unpack(doomed, first, math.min(first + CHUNK - 1, #doomed)))
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
return 'OK'

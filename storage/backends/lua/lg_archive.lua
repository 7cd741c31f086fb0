-- Take archived LangGraph checkpoints out of Redis: exactly what the archive holds of them.
-- KEYS: 1 the namespace's ids (sorted set), 2..n+1 the checkpoints' records, n+2..2n+1
--       their writes (hashes), 2n+2.. the b blobs only they named when they were read
-- ARGV: 1 n, 2 b, 3 check "1"/"0", 4..n+3 the checkpoint ids; then for each checkpoint in
--       order a count c and c pairs (field, the value the archive holds); then the ids of
--       the checkpoints the caller saw stay in Redis
-- The checkpoints leave the ids and their records go (a record is written once: the
-- archive's copy is it). A write goes only while Redis holds the value archived: one that
-- `put_writes` stored after the archive read the hash stays, and reads merge it over the
-- archive's. The blobs go only if the namespace holds no checkpoint the caller did not see
-- (with check "1"): a put meanwhile may name one of them (a fork from an archived
-- checkpoint). Then no blob goes, and the reply names those checkpoints for the caller to
-- read and send again. Every step can run twice (redis-py sends a command again when its
-- reply is lost): the second run finds nothing more to take.
-- Returns {how many checkpoints left the ids, the ids in Redis the caller did not see}.
local n, b = tonumber(ARGV[1]), tonumber(ARGV[2])
local moved = 0
local at = n + 4
for i = 1, n do
  moved = moved + redis.call('ZREM', KEYS[1], ARGV[i + 3])
  redis.call('DEL', KEYS[i + 1])
  local writes, count = KEYS[n + i + 1], tonumber(ARGV[at])
  for j = at + 1, at + 2 * count, 2 do
    if redis.call('HGET', writes, ARGV[j]) == ARGV[j + 1] then
      redis.call('HDEL', writes, ARGV[j])
    end
  end
  at = at + 1 + 2 * count
end
local unseen = {}
if b > 0 and ARGV[3] == '1' then
  local seen = {}
  for i = at, #ARGV do
    seen[ARGV[i]] = true
  end
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if not seen[id] then
      unseen[#unseen + 1] = id
    end
  end
end
if #unseen == 0 then
  for i = 2 * n + 2, 2 * n + b + 1 do
    redis.call('DEL', KEYS[i])
  end
end
return {moved, unseen}

-- Put a LangGraph checkpoint, fenced: the one write that moves a thread namespace's head.
-- KEYS: 1 head, 2 checkpoint record, 3 ids (sorted set), 4 namespaces (set), 5 the
--       thread's name, 6.. the blobs this checkpoint adds (one per new channel version)
-- ARGV: 1 checkpoint id, 2 parent id or "", 3 fork "1"/"0", 4 namespace, 5 record bytes,
--       6 thread id, 7.. the blobs' bytes, in KEYS order
-- A writer must extend the head it read: a put whose parent is not the head is refused,
-- unless the writer forks on purpose (it read that parent by id: time travel). So two
-- writers racing on one thread get an error, not two silent branches.
-- Every record is written once. The same put twice (redis-py retries a command whose
-- reply it lost) finds its own bytes and is a no-op; other bytes under a checkpoint id or
-- a blob key are refused, never overwritten, so no branch can change what another reads.
-- Returns how many checkpoints the namespace holds in Redis (for retention).
local stored = redis.call('GET', KEYS[2])
if stored and stored ~= ARGV[5] then
  return redis.error_reply('FENCED checkpoint ' .. ARGV[1] ..
    ' is stored already with other contents: a checkpoint is written once')
end
for i = 6, #KEYS do
  local blob = redis.call('GET', KEYS[i])
  if blob and blob ~= ARGV[i + 1] then
    return redis.error_reply('FENCED blob ' .. KEYS[i] .. ' holds another value: two ' ..
      'writers named one blob, and a blob is written once')
  end
end
if stored then
  return redis.call('ZCARD', KEYS[3])
end
local head = redis.call('GET', KEYS[1])
if head and ARGV[3] ~= '1' and head ~= ARGV[2] then
  return redis.error_reply('FENCED thread head is ' .. head .. ', not the parent ' ..
    (ARGV[2] ~= '' and ARGV[2] or '(none)') .. ': another writer extended this thread')
end
for i = 6, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 1])
end
redis.call('SET', KEYS[2], ARGV[5])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[4])
redis.call('SET', KEYS[5], ARGV[6])
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('ZCARD', KEYS[3])

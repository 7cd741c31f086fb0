-- Count what one step attempt's model call spent, once however often it is sent.
-- KEYS: 1 the task's spend hash, 2 the superstep's per-attempt spend hash
-- ARGV: 1 agent, 2 attempt, 3 prompt tokens, 4 completion tokens, 5 cached tokens,
--       6 cost (USD), 7 TTL of the per-attempt hash (s)
-- A step takes at most one model turn an attempt, so "agent:attempt" names the call: a
-- command redis-py sends again after a lost reply finds it counted and adds nothing.
-- Counters only rise: a retry, a rollback or a restore never takes spend back.
-- 1, or 0 if this call was counted already.
local field = ARGV[1] .. ':' .. ARGV[2]
local spent = ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6]
if redis.call('HSETNX', KEYS[2], field, spent) == 0 then
  return 0
end
redis.call('EXPIRE', KEYS[2], ARGV[7])
local agent = ARGV[1] .. ':'
redis.call('HINCRBY', KEYS[1], agent .. 'prompt_tokens', ARGV[3])
redis.call('HINCRBY', KEYS[1], agent .. 'completion_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], agent .. 'cached_tokens', ARGV[5])
redis.call('HINCRBYFLOAT', KEYS[1], agent .. 'cost_usd', ARGV[6])
redis.call('HINCRBY', KEYS[1], agent .. 'calls', 1)
return 1

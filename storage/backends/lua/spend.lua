-- Count what one model call of one step attempt spent, once however often it is sent.
-- KEYS: 1 the task's spend hash, 2 the superstep's per-attempt spend hash
-- ARGV: 1 agent, 2 attempt, 3 prompt tokens, 4 completion tokens, 5 cached tokens,
--       6 cost (USD), 7 TTL of the per-attempt hash (s), 8 the call's number in its attempt
-- "agent:attempt#call" names the call: a command redis-py sends again after a lost reply
-- finds it counted and adds nothing. "agent:attempt" holds the attempt's calls summed
-- ("prompt completion cached cost"), what the coordinator reads of a step in flight.
-- Counters only rise: a retry, a rollback or a restore never takes spend back.
-- 1, or 0 if this call was counted already.
local field = ARGV[1] .. ':' .. ARGV[2]
if redis.call('HSETNX', KEYS[2], field .. '#' .. ARGV[8], 1) == 0 then
  return 0
end
local prompt, completion, cached, cost = tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5]), tonumber(ARGV[6])
local before = redis.call('HGET', KEYS[2], field)
if before then
  local p, c, k, usd = string.match(before, '^(%S+) (%S+) (%S+) (%S+)$')
  prompt, completion = prompt + tonumber(p), completion + tonumber(c)
  cached, cost = cached + tonumber(k), cost + tonumber(usd)
end
redis.call('HSET', KEYS[2], field, string.format('%d %d %d %.17g', prompt, completion, cached, cost))
redis.call('EXPIRE', KEYS[2], ARGV[7])
local agent = ARGV[1] .. ':'
redis.call('HINCRBY', KEYS[1], agent .. 'prompt_tokens', ARGV[3])
redis.call('HINCRBY', KEYS[1], agent .. 'completion_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], agent .. 'cached_tokens', ARGV[5])
redis.call('HINCRBYFLOAT', KEYS[1], agent .. 'cost_usd', ARGV[6])
redis.call('HINCRBY', KEYS[1], agent .. 'calls', 1)
return 1

-- Keep a step's heartbeat alive, unless its attempt is no longer the agent's current one.
-- KEYS: 1 heartbeat, 2 attempts
-- ARGV: 1 token "host:pid:epoch:superstep:attempt", 2 TTL (ms), 3 agent
-- A zombie (its step retried, or its epoch restored away) must neither keep the key alive
-- for the attempt that replaced it nor overwrite that attempt's beat. 1, or 0 if fenced.
local current = redis.call('HGET', KEYS[2], ARGV[3])
if current and string.sub(ARGV[1], -(#current + 1)) ~= ':' .. current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1

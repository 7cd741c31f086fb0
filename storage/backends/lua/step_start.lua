-- Everything a step needs from Redis to begin, in one round trip, first beat included.
-- KEYS: 1 heartbeat, 2 epoch, 3 latest, 4 progress, 5 spec document, 6 attempts
-- ARGV: 1 heartbeat token, 2 heartbeat TTL (ms), 3 agent, 4 gc key prefix ("cairn:{task}:gc:")
-- Returns {epoch, latest GC number, latest GC sealed bytes, progress "id checksum", spec,
--          the agent's current "epoch:superstep:attempt"}.
-- The GC key is built from `latest`; it carries the task's hash tag like KEYS. The beat is
-- fenced as beat.lua fences it: a stale attempt does not overwrite the current one's.
local current = redis.call('HGET', KEYS[6], ARGV[3])
if not current or string.sub(ARGV[1], -(#current + 1)) == ':' .. current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
local latest = redis.call('GET', KEYS[3])
local gc = false
if latest then gc = redis.call('HGET', ARGV[4] .. latest, 'data') end
return {
  redis.call('GET', KEYS[2]),
  latest,
  gc,
  redis.call('HGET', KEYS[4], ARGV[3]),
  redis.call('GET', KEYS[5]),
  current,
}

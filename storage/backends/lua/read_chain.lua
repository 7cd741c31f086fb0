-- Read an LC and its ancestors, newest first, in one round trip.
-- KEYS: 1 the newest lc
-- ARGV: 1 the task's lc key prefix ("cairn:{task}:lc:"), 2 most links to read
-- Ancestor keys are built here from the prefix; they carry the same {task} hash tag, so
-- the script still touches one cluster slot. Stops after a full LC or a missing one.
local out = {}
local key = KEYS[1]
for _ = 1, tonumber(ARGV[2]) do
  local f = redis.call('HMGET', key, 'data', 'parent', 'full')
  if not f[1] then break end
  out[#out + 1] = f[1]
  if f[3] == '1' or f[2] == '' then break end
  key = ARGV[1] .. f[2]
end
return out

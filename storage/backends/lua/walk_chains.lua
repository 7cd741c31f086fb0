-- Walk LC chains back through their parents from many heads, in one round trip.
-- KEYS: the heads' lc keys
-- ARGV: 1 the task's lc key prefix ("cairn:{task}:lc:"), 2.. ids already known
-- Returns the ids of the hot LCs visited. A walk stops after a full LC, before a missing
-- one, and before an id already known or visited (so a cycle ends too). Parent keys are
-- built from the prefix and carry the heads' {task} hash tag: still one cluster slot.
local prefix = ARGV[1]
local seen = {}
for i = 2, #ARGV do
  seen[ARGV[i]] = true
end
local out = {}
for _, head in ipairs(KEYS) do
  local id = string.sub(head, #prefix + 1)
  while id ~= '' and not seen[id] do
    local f = redis.call('HMGET', prefix .. id, 'parent', 'full')
    if not f[2] then break end
    seen[id] = true
    out[#out + 1] = id
    if f[2] == '1' then break end
    id = f[1] or ''
  end
end
return out

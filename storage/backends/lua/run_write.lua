-- Change a task's run state, only if the writer still owns the task (or is a person), and,
-- when asked, only if the task's latest committed GC is the one the change stands on.
-- KEYS: 1 owner, 2 run, 3 steps, 4 latest
-- ARGV: 1 token ('' for a person's request, which is not fenced), 2 run fields (JSON
--       object of strings), 3 steps fields (JSON object), 4 '1' to clear steps first,
--       5 run fields to delete (JSON array), 6 the latest GC number it stands on ('': any)
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED coordinator token ' .. ARGV[1] .. ' no longer owns the task')
end
if ARGV[6] ~= '' then
  local latest = redis.call('GET', KEYS[4])
  if latest ~= ARGV[6] then
    return redis.error_reply('REFUSED the latest GC here is ' .. (latest or 'none') ..
      ', not GC ' .. ARGV[6] .. ', which the change stands on')
  end
end
if ARGV[4] == '1' then redis.call('DEL', KEYS[3]) end
for field, value in pairs(cjson.decode(ARGV[2])) do redis.call('HSET', KEYS[2], field, value) end
for field, value in pairs(cjson.decode(ARGV[3])) do redis.call('HSET', KEYS[3], field, value) end
for _, field in ipairs(cjson.decode(ARGV[5])) do redis.call('HDEL', KEYS[2], field) end
return 'OK'

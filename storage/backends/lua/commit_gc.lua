-- Commit a global checkpoint: the single write that is the commit point of the 2PC, and
-- optionally the start of the next superstep in the same atomic step.
-- KEYS: 1 epoch, 2 gc, 3 gcs, 4 latest, 5 workspace manifest blob, 6 tentative LCs,
--       7 votes, 8 progress, 9 owner, 10 the superstep's per-attempt spend;
--       to begin the next superstep too: 11 its gc, 12 attempts, 13 audit stream
-- ARGV: 1 number, 2 epoch, 3 sealed bytes, 4 checksum, 5 superstep, 6 lc key prefix,
--       7 owner token or "", 8 members, a line "lc_id\tchecksum\tagent\n" each,
--       9 how many lines ARGV[8] holds; with KEYS 11-13: 10 the next GC's number,
--       11 its sealed bytes (PREPARING), 12 its checksum, 13 its superstep, 14 the
--       attempts to fence in, a line "agent\tattempt\n" each, 15 audit "1"/"0"
-- Replies OK (committed), BEGUN (committed, and the next superstep prepared and fenced
-- in), EXISTS (committed before: nothing written, nothing begun).
-- Member LC keys are built here from the prefix; they carry the task's hash tag like KEYS,
-- so the script touches one cluster slot. Its Redis calls do not grow with the team: only
-- a member carried over from an earlier superstep is read on its own.
-- Every check runs before the first write, so a refused commit writes nothing. The next
-- superstep begins only if the commit is written and none of its own checks fails (its
-- GC already decided, an attempt fenced past it): else the commit alone is written, and
-- the caller begins it apart, where the refusal is reported.
local CHUNK = 1000 -- arguments per variadic call: unpack() is bounded by Lua's C stack
local TAB = 9
local byte, find, sub = string.byte, string.find, string.sub
local prefix, packed = ARGV[6], ARGV[8]

local function refuse(message) return redis.error_reply('REFUSED ' .. message) end
local function fence(message) return redis.error_reply('FENCED ' .. message) end

-- Run `command` (with `key` first, unless nil) over `names` in chunks; concatenate the
-- replies of a command that returns a list, add those of one that returns a count.
local function call_chunked(command, key, names)
  local out, count = {}, 0
  for first = 1, #names, CHUNK do
    local last = math.min(first + CHUNK - 1, #names)
    local reply
    if key then
      reply = redis.call(command, key, unpack(names, first, last))
    else
      reply = redis.call(command, unpack(names, first, last))
    end
    if type(reply) == 'table' then
      for _, v in ipairs(reply) do out[#out + 1] = v end
    else
      count = count + reply
    end
  end
  return out, count
end

-- The member lines: each LC id, and where its "\tchecksum\tagent" tail starts and ends.
-- The tails stay in `packed` (plain find, no substrings: every string made costs).
local function read_members()
  local ids, tabs, eols, at = {}, {}, {}, 1
  while at <= #packed do
    local tab = find(packed, '\t', at, true)
    local eol = tab and find(packed, '\n', tab, true)
    if not eol then break end
    ids[#ids + 1] = sub(packed, at, tab - 1)
    tabs[#tabs + 1], eols[#eols + 1] = tab, eol
    at = eol + 1
  end
  return ids, tabs, eols
end

-- A tentative entry is "parent\tchecksum\tagent", the parent "" unless it is tentative
-- too. True when `entry` ends with the member line's tail: this superstep wrote this LC
-- with this checksum for this agent.
local function entry_matches(entry, tab, eol)
  if not entry then return false end
  if byte(entry, 1) == TAB then
    -- find() runs only on equal lengths, and a match elsewhere is no match
    return tab + #entry == eol and find(packed, entry, tab, true) == tab
  end
  local tail = sub(packed, tab, eol - 1)
  return #entry > #tail and find(entry, tail, #entry - #tail + 1, true) ~= nil
end

-- The checksum and agent of a member line, made into strings only where needed.
local function line_fields(tab, eol)
  local sep = find(packed, '\t', tab + 1, true)
  return sub(packed, tab + 1, sep - 1), sub(packed, sep + 1, eol - 1)
end

-- Check a member that is not tentative (carried over from an earlier GC) on its LC.
local function check_lc(key, tab, eol)
  local sum, agent = line_fields(tab, eol)
  local f = redis.call('HMGET', key, 'sum', 'agent')
  if not f[1] then return refuse('LC ' .. key .. ' of ' .. agent .. ' is missing') end
  if f[1] ~= sum or f[2] ~= agent then
    return refuse('LC ' .. key .. ' of ' .. agent .. ' does not match its vote')
  end
end

-- Delete the tentative LCs that are neither a member nor an ancestor a member's delta
-- rests on (tool-level LCs, refused retries). Deleting the hash then commits the rest.
local function sweep(ids)
  local flat, tentative = redis.call('HGETALL', KEYS[6]), {}
  for i = 1, #flat, 2 do tentative[flat[i]] = flat[i + 1] end
  for _, id in ipairs(ids) do
    local entry = tentative[id]
    while entry do
      tentative[id] = nil
      if byte(entry, 1) == TAB then break end
      id = sub(entry, 1, find(entry, '\t', 1, true) - 1)
      entry = tentative[id]
    end
  end
  local doomed = {}
  for id in pairs(tentative) do doomed[#doomed + 1] = prefix .. id end
  call_chunked('DEL', nil, doomed)
end

if ARGV[7] ~= '' and redis.call('GET', KEYS[9]) ~= ARGV[7] then
  return fence('coordinator token ' .. ARGV[7] .. ' no longer owns the task')
end
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[2] then
  return fence('stale epoch ' .. ARGV[2] .. ' (task is at ' .. (epoch or 'none') .. ')')
end
local status = redis.call('HGET', KEYS[2], 'status')
if status == 'COMMITTED' then
  if redis.call('HGET', KEYS[2], 'sum') == ARGV[4] then return 'EXISTS' end
  return refuse('GC ' .. ARGV[1] .. ' is already committed')
end
if status == 'ABORTED' then
  return refuse('GC ' .. ARGV[1] .. ' was aborted')
end
if redis.call('EXISTS', KEYS[5]) == 0 then
  return refuse('workspace manifest ' .. KEYS[5] .. ' is not stored')
end

local ids, tabs, eols = read_members()
if #ids ~= tonumber(ARGV[9]) then
  return redis.error_reply('ERR commit_gc: ' .. #ids .. ' member lines read, ' .. ARGV[9] .. ' sent')
end
-- A tentative entry is written by write_lc.lua in the same atomic step as its LC: a
-- member matching its entry needs no read of the LC.
local entries = call_chunked('HMGET', KEYS[6], ids)
local found, found_at = {}, {}
for i, id in ipairs(ids) do
  if entry_matches(entries[i], tabs[i], eols[i]) then
    found[#found + 1], found_at[#found_at + 1] = prefix .. id, i
  else
    local refused = check_lc(prefix .. id, tabs[i], eols[i])
    if refused then return refused end
  end
end
-- An entry outlives its LC if the LC alone is deleted (by hand, by eviction): count
-- them all at once, and only on a miss look for the one that is gone.
local _, present = call_chunked('EXISTS', nil, found)
if present ~= #found then
  for i, key in ipairs(found) do
    if redis.call('EXISTS', key) == 0 then
      local _, agent = line_fields(tabs[found_at[i]], eols[found_at[i]])
      return refuse('LC ' .. key .. ' of ' .. agent .. ' is missing')
    end
  end
end

-- The attempts of the next superstep, if asked for and none is fenced past already (as
-- begin_attempt.lua would refuse it): {agent, "epoch:superstep:attempt"} each.
local function next_attempts()
  if #KEYS < 13 then return nil end
  local status = redis.call('HGET', KEYS[11], 'status')
  if status and status ~= 'PREPARING' then return nil end
  local e, ns = tonumber(ARGV[2]), tonumber(ARGV[13])
  local out = {}
  for agent, attempt in string.gmatch(ARGV[14], '([^\t\n]+)\t(%d+)\n') do
    local current = redis.call('HGET', KEYS[12], agent)
    if current then
      local ce, cs, ca = string.match(current, '^(%d+):(%d+):(%d+)$')
      ce, cs, ca = tonumber(ce), tonumber(cs), tonumber(ca)
      local na = tonumber(attempt)
      if ce > e or (ce == e and (cs > ns or (cs == ns and ca > na))) then return nil end
    end
    out[#out + 1] = {agent, ARGV[2] .. ':' .. ARGV[13] .. ':' .. attempt}
  end
  return out
end
local begin = next_attempts()

redis.call('HSET', KEYS[2], 'data', ARGV[3], 'sum', ARGV[4], 'status', 'COMMITTED', 'superstep', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
-- Each member found is an entry of its own; the hash holds nothing else, so there is
-- nothing to sweep, exactly when it is as long. An ancestor a member rests on, a tool
-- LC, a refused retry: each is one entry more.
if redis.call('HLEN', KEYS[6]) ~= #found then sweep(ids) end
-- UNLINK: a team's votes and tentative entries are freed off Redis's main thread. The
-- per-attempt spend is read only while its superstep is in flight; committed, the LCs'
-- usage holds it, and the task's spend hash counted it.
redis.call('UNLINK', KEYS[6], KEYS[7], KEYS[8], KEYS[10])
local latest = tonumber(redis.call('GET', KEYS[4]) or '-1')
if tonumber(ARGV[1]) > latest then redis.call('SET', KEYS[4], ARGV[1]) end
if not begin then return 'OK' end

-- The next superstep, as prepare_gc.lua and begin_attempt.lua write it.
redis.call('HSET', KEYS[11], 'data', ARGV[11], 'sum', ARGV[12], 'status', 'PREPARING', 'superstep', ARGV[13])
redis.call('ZADD', KEYS[3], ARGV[10], ARGV[10])
for _, fenced in ipairs(begin) do
  redis.call('HSET', KEYS[12], fenced[1], fenced[2])
  if ARGV[15] == '1' then
    redis.call('XADD', KEYS[13], 'MAXLEN', '~', '100000', '*', 'kind', 'fence', 'agent', fenced[1],
      'at', fenced[2])
  end
end
return 'BEGUN'

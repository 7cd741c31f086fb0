-- Take up to ARGV[1] jobs off RQ's queues, each with its hash, in one round trip: a worker
-- with free lanes takes what waits at once instead of a pop and a read per job.
-- KEYS: the queues' lists, in the order the worker serves them (the first emptied first)
-- ARGV: 1 how many jobs at most, 2 the prefix of a job's hash key (RQ's `rq:job:`)
-- Returns: queue key, job id and the job's hash (field, value, ...) of each job taken. A
-- job whose hash is gone is taken and left out, as RQ's own dequeue skips it.
-- The hashes' keys are built here, undeclared: RQ's keys carry no common hash tag, and RQ
-- runs on one Redis (or a Sentinel-managed primary), never a cluster.
-- Not idempotent, as RQ's own pop is not: a reply lost and sent again takes more jobs,
-- and those first taken are retried by the coordinator as taken and never started.
local left = tonumber(ARGV[1])
local taken = {}
for _, queue in ipairs(KEYS) do
  while left > 0 do
    local id = redis.call('LPOP', queue)
    if not id then break end
    local fields = redis.call('HGETALL', ARGV[2] .. id)
    if #fields > 0 then
      left = left - 1
      taken[#taken + 1] = queue
      taken[#taken + 1] = id
      taken[#taken + 1] = fields
    end
  end
end
return taken

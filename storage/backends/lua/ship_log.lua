-- Add one log line to a task's capped stream, only while the task is in Redis: a line a
-- process logs after the task was forgotten must not bring a key of it back.
-- KEYS: 1 run, 2 logs
-- ARGV: 1 the lines kept (about: MAXLEN ~), 2.. the line's fields and values, alternating
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 2))
return 1

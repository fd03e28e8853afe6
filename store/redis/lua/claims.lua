-- claims.lua: what each process asks of one quota bucket (package rlqs),
-- so that each divides the bucket's limit among all processes by their
-- claims (store/redis/claims.go).
-- KEYS[1]: the bucket's claims: a hash of process id to "claim:expiry",
--   the expiry in server milliseconds.
-- ARGV[1]: this process's id; ARGV[2]: its claim; ARGV[3]: how long the
--   claim lives (ms); ARGV[4]: the most processes the hash holds (past it a
--   new process's claim is not kept, and it is told so with "full").
-- Returns the live claims of the other processes, and "full" if this
-- process's claim was not kept.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
local others, live = {}, 0
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local sep = string.find(v, ':', 1, true)
  local expiry = tonumber(string.sub(v, sep + 1))
  if expiry <= now then
    redis.call('HDEL', KEYS[1], id)
  elseif id ~= ARGV[1] then
    others[#others + 1] = string.sub(v, 1, sep - 1)
    live = live + 1
  end
end
local full = live >= cap and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
if full then
  others[#others + 1] = 'full'
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + ttl))
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
end
return others

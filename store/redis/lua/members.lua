-- members.lua: one gateway's heartbeat in the membership set, and the count
-- of live gateways. The set's members are gateway ids scored by the time
-- (server milliseconds) their heartbeat expires; expired ones are dropped.
-- KEYS[1]: the membership set.
-- ARGV[1]: this gateway's id; ARGV[2]: the heartbeat's time to live in ms,
--   or "0" to leave the set.
-- Returns the number of live gateways.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ttl * 3)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])

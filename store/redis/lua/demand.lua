-- demand.lua: pools what a region's processes were asked of a global
-- rule's keys, for the region's agent (store/redis/pool.go).
-- KEYS[1]: units asked by key; KEYS[2]: units refused by key.
-- ARGV[1]: "add" or "take".
-- add: ARGV[2] the hashes' time to live (ms), ARGV[3] the most keys they
--   hold, then triples of key, asked, refused. A key past the bound is not
--   counted: it keeps the share it has.
-- take: returns both hashes' fields and values and deletes them.
if ARGV[1] == 'take' then
  local a = redis.call('HGETALL', KEYS[1])
  local s = redis.call('HGETALL', KEYS[2])
  redis.call('DEL', KEYS[1], KEYS[2])
  return {a, s}
end
local ttl, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local n = redis.call('HLEN', KEYS[1])
for i = 4, #ARGV, 3 do
  local k, asked, short = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if asked > 0 and (n < cap or redis.call('HEXISTS', KEYS[1], k) == 1) then
    if redis.call('HINCRBY', KEYS[1], k, asked) == asked then n = n + 1 end
    if short > 0 then redis.call('HINCRBY', KEYS[2], k, short) end
  end
end
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return n

-- lead.lua: the lead of a region's agent. KEYS[1]: the lead's key;
-- ARGV[1]: the asking process; ARGV[2]: how long the lead lasts (ms).
-- The lead is taken when free and kept by its holder asking again in time.
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0

-- leaky_meter.lua: the leaky bucket as a meter. State: hash {v = level (in
-- microseconds of drain), l = last drain}; a missing key is empty.
-- Mirrors algo/leakymeter.go.
local function lm_load(key, now)
  local v = redis.call('HMGET', key, 'v', 'l')
  local level, last = tonumber(v[1]), tonumber(v[2])
  if level == nil or last == nil then return 0, now end
  if now > last then
    local elapsed = now - last
    if elapsed >= level then level = 0 else level = level - elapsed end
    last = now
  end
  return level, last
end

local function lm_decide(key, p, now, cost)
  local level, last = lm_load(key, now)
  local room = p.D - level
  if cost == 0 then return allowed(math.floor(room / p.T), level), nil end
  if cost > p.L then return toolarge(math.floor(room / p.T), level), nil end
  local need = cost * p.T
  if need > room then return limited(math.floor(room / p.T), need - room, level), nil end
  level = level + need
  return allowed(math.floor((room - need) / p.T), level), {level, last}
end

local function lm_write(key, st, ttl)
  redis.call('HSET', key, 'v', string.format('%.0f', st[1]), 'l', string.format('%.0f', st[2]))
  redis.call('PEXPIRE', key, ttl)
end

local function lm_refund(key, p, now, units)
  local level, last = lm_load(key, now)
  return {math.max(0, level - units * p.T), last}
end

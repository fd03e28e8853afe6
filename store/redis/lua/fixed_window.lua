-- fixed_window.lua: the fixed window counter. State: hash {s = window
-- start, c = count}. Mirrors algo/fixedwindow.go.
local function fw_load(key, p, now)
  local v = redis.call('HMGET', key, 's', 'c')
  local s, c = tonumber(v[1]) or -1e300, tonumber(v[2]) or 0
  local start = window_start(now, p.W)
  if start > s then s, c = start, 0 elseif start < s then now = s end
  return s, c, now
end

local function fw_decide(key, p, now, cost)
  local s, c
  s, c, now = fw_load(key, p, now)
  local left = s + p.W - now
  local reset = left
  if c == 0 then reset = 0 end
  if cost == 0 then return allowed(p.L - c, reset), nil end
  if cost > p.L then return toolarge(p.L - c, reset), nil end
  if c + cost > p.L then return limited(p.L - c, left, reset), nil end
  return allowed(p.L - c - cost, left), {s, c + cost}
end

local function fw_write(key, st, ttl)
  redis.call('HSET', key, 's', string.format('%.0f', st[1]), 'c', string.format('%.0f', st[2]))
  redis.call('PEXPIRE', key, ttl)
end

local function fw_refund(key, p, now, units)
  local v = redis.call('HMGET', key, 's', 'c')
  local s, c = tonumber(v[1]), tonumber(v[2])
  if s == nil or window_start(now, p.W) ~= s then return nil end
  return {s, math.max(0, c - units)}
end

-- fixed_window.lua: the fixed window counter. State: one decimal string,
-- the window's index (its start / W; windows are aligned to multiples of W)
-- followed by the count in exactly as many digits as the limit has: 1000
-- per second at window 1796038990 with 12 taken is "17960389900012". It is
-- split as a string, so it is exact at any size, and Redis keeps one that
-- fits 64 bits as an integer in the object itself, its smallest value (a
-- hash of start and count costs about 48 bytes more per key).
-- Mirrors algo/fixedwindow.go.
local function fw_digits(p) return #string.format('%.0f', p.L) end

local function fw_load(key, p, now)
  local v = redis.call('GET', key)
  local start = window_start(now, p.W)
  if not v then return start, 0, now end
  local k = fw_digits(p)
  local s, c = (tonumber(string.sub(v, 1, -k - 1)) or -1e300) * p.W, tonumber(string.sub(v, -k)) or 0
  if start > s then return start, 0, now end
  if start < s then now = s end
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
  return allowed(p.L - c - cost, left), {s, c + cost, p}
end

local function fw_write(key, st, ttl)
  local p = st[3]
  local v = string.format('%.0f', st[1] / p.W) .. string.format('%0' .. fw_digits(p) .. '.0f', st[2])
  redis.call('SET', key, v, 'PX', ttl)
end

local function fw_refund(key, p, now, units)
  local s, c = fw_load(key, p, now)
  if c == 0 or s ~= window_start(now, p.W) then return nil end
  return {s, math.max(0, c - units), p}
end

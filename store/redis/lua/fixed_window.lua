-- fixed_window.lua: the fixed window counter. State: one decimal string,
-- the window's index followed by the count in exactly as many digits as the
-- limit has: 1000 per second at window 1796038990 with 12 taken is
-- "17960389900012". The index is the window's start / W (windows aligned to
-- multiples of W), or for a calendar window (a negative p.T: 1 day, 2 week,
-- 3 month, 4 year, UTC) the day, week (from Monday), month or year
-- counted from the epoch. It is split as a string, so it is exact at any
-- size, and Redis keeps one that fits 64 bits as an integer in the object
-- itself, its smallest value (a hash of start and count costs about 48
-- bytes more per key). Mirrors algo/fixedwindow.go and algo/calendar.go.
local FW_DAY = 86400000000 -- microseconds

-- Days since 1970-01-01 of a proleptic Gregorian date, and back (H. Hinnant,
-- "chrono-Compatible Low-Level Date Algorithms").
local function fw_days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end

local function fw_civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

-- fw_start returns the start of window idx; fw_index the index of the
-- window holding t, and its start.
local function fw_start(p, idx)
  local cal = p.T < 0 and -p.T or 0
  if cal == 0 then return idx * p.W end
  if cal == 1 then return idx * FW_DAY end
  if cal == 2 then return (idx * 7 - 3) * FW_DAY end
  if cal == 3 then return fw_days_from_civil(math.floor(idx / 12), idx % 12 + 1, 1) * FW_DAY end
  return fw_days_from_civil(idx, 1, 1) * FW_DAY
end

local function fw_index(p, t)
  local cal = p.T < 0 and -p.T or 0
  if cal == 0 then
    local s = window_start(t, p.W)
    return s / p.W, s
  end
  local days = math.floor(t / FW_DAY)
  local idx
  if cal == 1 then
    idx = days
  elseif cal == 2 then
    idx = math.floor((days + 3) / 7) -- weeks from Monday, 1969-12-29
  else
    local y, m = fw_civil_from_days(days)
    if cal == 3 then idx = y * 12 + m - 1 else idx = y end
  end
  return idx, fw_start(p, idx)
end

-- fw_digits returns the number of decimal digits of the limit, and 10 to
-- that power, both kept in p: computed by multiplying (exact: the limit is
-- below 2^53, the power at most 10^16) rather than by formatting, the
-- dearest step of a decision after the Redis calls themselves.
local function fw_digits(p)
  if not p.K then
    local k, ten = 1, 10
    while p.L >= ten do k, ten = k + 1, ten * 10 end
    p.K, p.M = k, ten
  end
  return p.K, p.M
end

local function fw_load(key, p, now)
  local v = redis.call('GET', key)
  local idx, start = fw_index(p, now)
  if not v then return start, idx, 0, now end
  local k, m = fw_digits(p)
  local sidx, c
  local colon = string.find(v, ':', 1, true)
  if colon then -- a count beyond the limit, after a charge: index:count
    sidx, c = tonumber(string.sub(v, 1, colon - 1)), tonumber(string.sub(v, colon + 1)) or 0
  else
    local n = #v <= 15 and tonumber(v)
    if n then
      -- Below 10^15 the value is an exact double: split it by arithmetic.
      sidx = math.floor(n / m)
      c = n - sidx * m
      if #v <= k then sidx = nil end -- no index before the count: not ours
    else
      sidx, c = tonumber(string.sub(v, 1, -k - 1)), tonumber(string.sub(v, -k)) or 0
    end
  end
  if sidx == nil or idx > sidx then return start, idx, 0, now end
  if idx < sidx then -- time went back into an earlier window: no time has elapsed
    start = fw_start(p, sidx)
    return start, sidx, c, start
  end
  return start, idx, c, now
end

local function fw_decide(key, p, now, cost)
  local s, idx, c
  s, idx, c, now = fw_load(key, p, now)
  local left = fw_start(p, idx + 1) - now
  local reset = left
  if c == 0 then reset = 0 end
  if cost == 0 then
    if c > p.L then return limited(0, left, reset), nil end -- in debt
    return allowed(p.L - c, reset), nil
  end
  if cost > p.L then return toolarge(p.L - c, reset), nil end
  if cost > p.L - c then return limited(p.L - c, left, reset), nil end
  return allowed(p.L - c - cost, left), {idx, c + cost, p}
end

local function fw_write(key, st, ttl)
  local p = st[3]
  if not p.F then p.F = '%.0f%0' .. fw_digits(p) .. '.0f' end
  local v = string.format(p.F, st[1], st[2])
  if st[2] > st[3].L then v = string.format('%.0f:%.0f', st[1], st[2]) end
  redis.call('SET', key, v, 'PX', ttl)
end

local function fw_charge(key, p, now, units)
  local s, idx, c = fw_load(key, p, now)
  return {idx, c + units, p}
end

local function fw_refund(key, p, now, units)
  local s, idx, c = fw_load(key, p, now)
  local nidx = fw_index(p, now)
  if c == 0 or idx ~= nidx then return nil end
  return {idx, math.max(0, c - units), p}
end

-- The count of the window holding now carries, into the new limit's window
-- holding now (the same window when the windows are alike).
local function fw_carry(from, to, fp, tp, now)
  local s, idx, c = fw_load(from, fp, now)
  if c == 0 then return end
  if fp.W ~= tp.W or math.min(fp.T, 0) ~= math.min(tp.T, 0) then idx = fw_index(tp, now) end
  fw_write(to, {idx, c, tp}, ceildiv(fw_start(tp, idx + 1) - now, 1000) + 1000)
end

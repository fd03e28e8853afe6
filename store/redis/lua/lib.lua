-- lib.lua: shared helpers. All times and durations are integer microseconds
-- held in Lua numbers (doubles), exact below 2^53 (about 285 years).
local function ceildiv(a, b)
  return math.floor((a + b - 1) / b)
end

local function window_start(t, w)
  return t - (t % w)
end

-- result: allowed (0/1), reason, remaining, retry, reset, delay.
-- Reasons: 0 ok, 1 limited, 2 cost exceeds the limit.
-- A key in debt (see the charges) has less than nothing left: it reports 0.
local function allowed(rem, reset) return {1, 0, math.max(rem, 0), 0, reset, 0} end
local function limited(rem, retry, reset) return {0, 1, math.max(rem, 0), retry, reset, 0} end
local function toolarge(rem, reset) return {0, 2, math.max(rem, 0), 0, reset, 0} end

-- A key's state moves to a new limit (algo/carry.go: what was spent stays
-- spent) scaled by T_to / T_from, rounded up. mul_div_ceil returns
-- ceil(x * a / b) for integers x >= 0, a > 0 and 0 < b < 2^52, exactly, or
-- cap if it is larger: x * a may be far beyond 2^53, so it is built bit by
-- bit of a, every sum staying below 2^53. Beyond b's bound (a limit of one
-- unit per 142 years) the double quotient is close enough.
local CARRY_CAP = 2 ^ 51 -- microseconds: 71 years, refused as long as any bound

local function mul_div_ceil(x, a, b)
  if x <= 0 then return 0 end
  if b >= 2 ^ 52 then return math.min(math.ceil(x * a / b), CARRY_CAP) end
  local qx = math.floor(x / b)
  local rx = x - qx * b
  if rx < 0 then qx, rx = qx - 1, rx + b elseif rx >= b then qx, rx = qx + 1, rx - b end
  local bits, n = {}, 0
  while a > 0 do
    local bit = a % 2
    n = n + 1
    bits[n] = bit
    a = (a - bit) / 2
  end
  local q, r = 0, 0
  for i = n, 1, -1 do
    q, r = q * 2, r * 2
    if r >= b then q, r = q + 1, r - b end
    if bits[i] == 1 then
      q, r = q + qx, r + rx
      if r >= b then q, r = q + 1, r - b end
    end
    if q >= CARRY_CAP then return CARRY_CAP end
  end
  if r > 0 then q = q + 1 end
  return math.min(q, CARRY_CAP)
end

-- carry_copy copies a key's state and TTL to another key of the slot.
local function carry_copy(from, to)
  redis.call('RESTORE', to, math.max(redis.call('PTTL', from), 0), redis.call('DUMP', from), 'REPLACE')
end

-- A key whose state moved to a new limit stays, as long as it would have
-- (its time back to idle), for the processes that have not seen the change
-- yet (behind a notification, cut off from Redis, paused): they count from
-- what it had spent, never afresh. Its marker says it moved, so that a take
-- carrying back into it (the change undone) treats it as absent; the marker
-- outlives the copy and, by CARRY_GRACE_MS, a late process's writes to it
-- (each sets the copy's life to at most its limit's time back to idle,
-- whose D and W are ARGV[c + 2], ARGV[c + 3]).
local CARRY_GRACE_MS = 60000

local function carry_mark(key) return key .. '\0moved' end

local function carry_leave(from, c)
  local idle = ceildiv(math.max(tonumber(ARGV[c + 2]), 2 * tonumber(ARGV[c + 3])), 1000) + 1000
  redis.call('SET', carry_mark(from), '1', 'PX', math.max(redis.call('PTTL', from), idle) + CARRY_GRACE_MS)
end

-- carry_bucket moves a packed bucket (the token bucket's empty instant,
-- the leaky meter's full one, both e with D - min(now - e, D) spent): the
-- spent part carries, scaled to the new T.
local function carry_bucket(from, to, fp, tp, now)
  local e = tonumber(redis.call('GET', from) or '')
  if not e then return end
  local spent = fp.D - math.min(now - e, fp.D)
  if spent <= 0 then return end
  local s = mul_div_ceil(spent, tp.T, fp.T)
  redis.call('SET', to, string.format('%.0f', now - (tp.D - s)), 'PX', ceildiv(s, 1000) + 1000)
end

-- carry_instant moves a state that is one instant ahead of now by the
-- backlog (GCRA's TAT, a queue's next departure) from one key to another.
local function carry_instant(from, to, fp, tp, now)
  local v = tonumber(redis.call('GET', from) or '')
  if not v or v <= now then return end
  local b = mul_div_ceil(v - now, tp.T, fp.T)
  redis.call('SET', to, string.format('%.0f', now + b), 'PX', ceildiv(b, 1000) + 1000)
end

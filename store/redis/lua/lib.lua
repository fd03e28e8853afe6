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

-- sliding_window.lua: the sliding window counter. State: hash {s = start of
-- the current window, p = previous count, c = current count}. The estimate
-- comparisons are exact: the Redis store accepts only limits with
-- L * W < 2^53 microseconds. Mirrors algo/slidingwindow.go.
local function sw_roll(key, p, now)
  local v = redis.call('HMGET', key, 's', 'p', 'c')
  local s, prev, cur = tonumber(v[1]) or -1e300, tonumber(v[2]) or 0, tonumber(v[3]) or 0
  local start = window_start(now, p.W)
  if start < s then return s, prev, cur, s end
  if start == s then return s, prev, cur, now end
  if start == s + p.W then return start, cur, 0, now end
  return start, 0, 0, now
end

local function sw_admissible(p, prev, cur, e)
  local used = prev * (p.W - e) + cur * p.W
  local total = p.L * p.W
  if used >= total then return 0 end
  return math.min(ceildiv(total - used, p.W), p.L)
end

local function sw_reset(p, s, prev, cur, now)
  if cur > 0 then return s + 2 * p.W - now end
  if prev > 0 then return s + p.W - now end
  return 0
end

local function sw_retry(p, prev, cur, e, cost)
  local a = p.L - cur - cost + 1
  if a > 0 and prev > 0 then
    local at = p.W - math.min(math.floor((a * p.W - 1) / prev), p.W)
    if at < p.W then return at - e end
  end
  local to_next = p.W - e
  if cur == 0 then return to_next end
  local at = p.W - math.min(math.floor(((p.L - cost + 1) * p.W - 1) / cur), p.W)
  if at < p.W then return to_next + math.max(at, 0) end
  return to_next + p.W
end

-- floor(x / d) for integers x >= 0, d > 0 below 2^53, exactly (a double
-- quotient may round up to the next integer).
local function sw_floordiv(x, d)
  local q = math.floor(x / d)
  if q * d > x then return q - 1 end
  if (q + 1) * d <= x then return q + 1 end
  return q
end

-- sw_over_for: the time from elapsed e until an estimate above L is back to
-- at most L. Mirrors SlidingWindow.overFor.
local function sw_over_for(p, prev, cur, e)
  if cur <= p.L and prev > 0 then
    local at = p.W - math.min(sw_floordiv((p.L - cur) * p.W, prev), p.W)
    if at < p.W then return at - e end
  end
  local to_next = p.W - e
  if cur <= p.L then return to_next end
  return to_next + p.W - math.min(sw_floordiv(p.L * p.W, cur), p.W)
end

local function sw_decide(key, p, now, cost)
  local s, prev, cur
  s, prev, cur, now = sw_roll(key, p, now)
  local e = now - s
  local rem = sw_admissible(p, prev, cur, e)
  local reset = sw_reset(p, s, prev, cur, now)
  if cost == 0 then
    if prev * (p.W - e) + cur * p.W > p.L * p.W then -- in debt
      return limited(0, sw_over_for(p, prev, cur, e), reset), nil
    end
    return allowed(rem, reset), nil
  end
  if cost > p.L then return toolarge(rem, reset), nil end
  if cost > rem then return limited(rem, sw_retry(p, prev, cur, e, cost), reset), nil end
  cur = cur + cost
  return allowed(sw_admissible(p, prev, cur, e), sw_reset(p, s, prev, cur, now)), {s, prev, cur}
end

local function sw_write(key, st, ttl)
  redis.call('HSET', key, 's', string.format('%.0f', st[1]), 'p', string.format('%.0f', st[2]), 'c', string.format('%.0f', st[3]))
  redis.call('PEXPIRE', key, ttl)
end

local function sw_charge(key, p, now, units)
  local s, prev, cur = sw_roll(key, p, now)
  return {s, prev, cur + units}
end

local function sw_refund(key, p, now, units)
  local s, prev, cur = sw_roll(key, p, now)
  return {s, prev, math.max(0, cur - units)}
end

-- Windows of one length keep both counts; otherwise the estimate at now,
-- rounded up, is counted in the new window holding now.
local function sw_carry(from, to, fp, tp, now)
  if fp.W == tp.W then
    carry_copy(from, to)
    return
  end
  local s, prev, cur, n = sw_roll(from, fp, now)
  local est = cur + mul_div_ceil(prev, fp.W - (n - s), fp.W)
  if est <= 0 then return end
  sw_write(to, {window_start(n, tp.W), 0, est}, ceildiv(2 * tp.W, 1000) + 1000)
end

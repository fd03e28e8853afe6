-- leaky_queue.lua: the leaky bucket as a queue. State: the next free
-- departure slot, a string; a missing key is an empty queue.
-- Mirrors algo/leakyqueue.go.
local function lq_queued(p, nxt, now)
  local ahead = nxt - p.T - now
  if ahead <= 0 then return 0 end
  return math.min(ceildiv(ahead, p.T), p.L)
end

local function lq_decide(key, p, now, cost)
  local v = redis.call('GET', key)
  local nxt = -1e300
  if v then nxt = tonumber(v) end
  local queued = lq_queued(p, nxt, now)
  local reset = math.max(0, nxt - now)
  if cost == 0 then
    -- queued is capped at L; a queue in debt is more than L departures ahead.
    local over = (nxt - p.T - now) - p.L * p.T
    if over > 0 then return limited(0, over, reset), nil end
    return allowed(p.L - queued, reset), nil
  end
  if cost > p.L then return toolarge(p.L - queued, reset), nil end
  if queued + cost > p.L then
    return limited(p.L - queued, (nxt - p.T - now) - (p.L - cost) * p.T, reset), nil
  end
  local departure = math.max(now, nxt) + (cost - 1) * p.T
  local nn = departure + p.T
  local r = allowed(p.L - lq_queued(p, nn, now), nn - now)
  r[6] = departure - now
  return r, {nn}
end

local function lq_write(key, st, ttl)
  redis.call('SET', key, string.format('%.0f', st[1]), 'PX', ttl)
end

local function lq_charge(key, p, now, units)
  local nxt = tonumber(redis.call('GET', key) or '') or now
  return {math.max(nxt, now) + units * p.T}
end

local function lq_refund(key, p, now, units)
  local v = redis.call('GET', key)
  if not v or tonumber(v) <= now then return nil end
  return {math.max(tonumber(v) - units * p.T, now)}
end

local function lq_carry(from, to, fp, tp, now) carry_instant(from, to, fp, tp, now) end

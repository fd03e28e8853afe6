-- gcra.lua: GCRA. State: the TAT, a string. Mirrors algo/gcra.go.
-- p = {T, D, W, L}; returns result, new state (nil: unchanged).
local function gcra_remaining(p, backlog)
  if backlog >= p.D then return 0 end
  return math.floor((p.D - backlog) / p.T)
end

local function gcra_decide(key, p, now, cost)
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  tat = math.max(tat, now)
  local backlog = tat - now
  if cost == 0 then
    if backlog > p.D then return limited(0, backlog - p.D, backlog), nil end -- in debt
    return allowed(gcra_remaining(p, backlog), backlog), nil
  end
  if cost > p.L then return toolarge(gcra_remaining(p, backlog), backlog), nil end
  local after = backlog + cost * p.T
  if after > p.D then return limited(gcra_remaining(p, backlog), after - p.D, backlog), nil end
  return allowed(gcra_remaining(p, after), after), {tat + cost * p.T}
end

local function gcra_write(key, st, ttl)
  redis.call('SET', key, string.format('%.0f', st[1]), 'PX', ttl)
end

local function gcra_charge(key, p, now, units)
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  return {math.max(tat, now) + units * p.T}
end

local function gcra_refund(key, p, now, units)
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  if tat <= now then return nil end
  return {math.max(tat - units * p.T, now)}
end

local function gcra_carry(from, to, fp, tp, now) carry_instant(from, to, fp, tp, now) end

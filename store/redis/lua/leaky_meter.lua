-- leaky_meter.lua: the leaky bucket as a meter. State: one integer string,
-- the instant e (microseconds) at which the bucket was, or will be, full to
-- the brim: at now its level is D - min(D, now - e) (microseconds of drain),
-- exactly what draining the two words (level, last) to now gives. A missing
-- key is empty. Above D (e after now) it is in debt, after a charge beyond
-- full. A clock that steps back makes the bucket look fuller, never emptier.
-- Mirrors algo/leakymeter.go.
local function lm_load(key, p, now)
  local e = tonumber(redis.call('GET', key) or '')
  if e == nil then return 0 end
  return p.D - math.min(now - e, p.D)
end

local function lm_decide(key, p, now, cost)
  local level = lm_load(key, p, now)
  local room = p.D - level
  if cost == 0 then
    if room < 0 then return limited(0, -room, level), nil end -- in debt
    return allowed(math.floor(room / p.T), level), nil
  end
  if cost > p.L then return toolarge(math.floor(room / p.T), level), nil end
  local need = cost * p.T
  if need > room then return limited(math.floor(room / p.T), need - room, level), nil end
  level = level + need
  return allowed(math.floor((room - need) / p.T), level), {now - (p.D - level)}
end

local function lm_write(key, st, ttl)
  redis.call('SET', key, string.format('%.0f', st[1]), 'PX', ttl)
end

local function lm_charge(key, p, now, units)
  return {now - (p.D - (lm_load(key, p, now) + units * p.T))}
end

local function lm_refund(key, p, now, units)
  local level = lm_load(key, p, now)
  if level <= 0 then return nil end
  return {now - (p.D - math.max(0, level - units * p.T))}
end

local function lm_carry(from, to, fp, tp, now) carry_bucket(from, to, fp, tp, now) end

-- token_bucket.lua: the token bucket. State: one integer string, the
-- instant e (microseconds) at which the bucket was, or would have been,
-- empty: at now it holds min(D, now - e) tokens (microseconds of refill),
-- exactly what refilling the two words (tokens, last) to now gives; below 0
-- (e after now) it is in debt, after a charge beyond empty. A missing key
-- is full. One integer is the smallest value Redis keeps (held
-- in the object itself, no allocation). A clock that steps back makes the
-- bucket look emptier, never fuller. Mirrors algo/tokenbucket.go.
local function tb_load(key, p, now)
  local e = tonumber(redis.call('GET', key) or '')
  if e == nil then return p.D end
  return math.min(now - e, p.D)
end

local function tb_decide(key, p, now, cost)
  local tokens = tb_load(key, p, now)
  local rem = math.floor(tokens / p.T)
  if cost == 0 then
    if tokens < 0 then return limited(0, -tokens, p.D - tokens), nil end -- in debt
    return allowed(rem, p.D - tokens), nil
  end
  if cost > p.L then return toolarge(rem, p.D - tokens), nil end
  local need = cost * p.T
  if tokens < need then return limited(rem, need - tokens, p.D - tokens), nil end
  tokens = tokens - need
  return allowed(math.floor(tokens / p.T), p.D - tokens), {now - tokens}
end

local function tb_write(key, st, ttl)
  redis.call('SET', key, string.format('%.0f', st[1]), 'PX', ttl)
end

local function tb_charge(key, p, now, units)
  return {now - (tb_load(key, p, now) - units * p.T)}
end

local function tb_refund(key, p, now, units)
  local tokens = tb_load(key, p, now)
  if tokens >= p.D then return nil end
  return {now - math.min(p.D, tokens + units * p.T)}
end

local function tb_carry(from, to, fp, tp, now) carry_bucket(from, to, fp, tp, now) end

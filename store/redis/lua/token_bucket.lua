-- token_bucket.lua: the token bucket. State: hash {t = tokens (in
-- microseconds of refill), l = last refill}; a missing key is full.
-- Mirrors algo/tokenbucket.go.
local function tb_load(key, p, now)
  local v = redis.call('HMGET', key, 't', 'l')
  local tokens, last = tonumber(v[1]), tonumber(v[2])
  if tokens == nil or last == nil then return p.D, now end
  if now > last then
    local elapsed = now - last
    if elapsed >= p.D - tokens then tokens = p.D else tokens = tokens + elapsed end
    last = now
  end
  return tokens, last
end

local function tb_decide(key, p, now, cost)
  local tokens, last = tb_load(key, p, now)
  local rem = math.floor(tokens / p.T)
  if cost == 0 then return allowed(rem, p.D - tokens), nil end
  if cost > p.L then return toolarge(rem, p.D - tokens), nil end
  local need = cost * p.T
  if tokens < need then return limited(rem, need - tokens, p.D - tokens), nil end
  tokens = tokens - need
  return allowed(math.floor(tokens / p.T), p.D - tokens), {tokens, last}
end

local function tb_write(key, st, ttl)
  redis.call('HSET', key, 't', string.format('%.0f', st[1]), 'l', string.format('%.0f', st[2]))
  redis.call('PEXPIRE', key, ttl)
end

local function tb_refund(key, p, now, units)
  local tokens, last = tb_load(key, p, now)
  return {math.min(p.D, tokens + units * p.T), last}
end

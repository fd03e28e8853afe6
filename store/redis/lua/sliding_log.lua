-- sliding_log.lua: the sliding window log. State: a list of the admitted
-- units' times, oldest first (each decision drops the expired head). A list
-- rather than a sorted set: times are appended in order (a clock that steps
-- back counts as the newest entry's time), so no member needs to be unique.
-- Mirrors algo/slidinglog.go.
local function sl_load(key, p, now)
  local entries = redis.call('LRANGE', key, 0, -1)
  local n = #entries
  if n > 0 then now = math.max(now, tonumber(entries[n])) end
  local cutoff = now - p.W
  local drop = 0
  while drop < n and tonumber(entries[drop + 1]) <= cutoff do drop = drop + 1 end
  return entries, drop, now
end

local function sl_decide(key, p, now, cost)
  local entries, drop
  entries, drop, now = sl_load(key, p, now)
  local count = #entries - drop
  local reset = 0
  if count > 0 then reset = tonumber(entries[#entries]) + p.W - now end
  if cost == 0 then
    -- Over, after a carry from a larger limit: until count - L have left.
    if count > p.L then return limited(0, tonumber(entries[drop + count - p.L]) + p.W - now, reset), nil end
    return allowed(p.L - count, reset), nil
  end
  if cost > p.L then return toolarge(p.L - count, reset), nil end
  local k = count + cost - p.L
  if k > 0 then return limited(p.L - count, tonumber(entries[drop + k]) + p.W - now, reset), nil end
  return allowed(p.L - count - cost, p.W), {drop, now, cost}
end

local function sl_write(key, st, ttl)
  if st[1] > 0 then redis.call('LTRIM', key, st[1], -1) end
  local t = string.format('%.0f', st[2])
  for i = 1, st[3] do redis.call('RPUSH', key, t) end
  redis.call('PEXPIRE', key, ttl)
end

-- A log holds at most L entries: a charge logs as many as fit.
local function sl_charge(key, p, now, units)
  local entries, drop
  entries, drop, now = sl_load(key, p, now)
  return {drop, now, math.max(0, math.min(units, p.L - (#entries - drop)))}
end

local function sl_refund(key, p, now, units)
  local entries, drop
  entries, drop, now = sl_load(key, p, now)
  if drop > 0 then redis.call('LTRIM', key, drop, -1) end
  for i = 1, math.min(units, #entries - drop) do redis.call('RPOP', key) end
  return nil
end

-- The entries both windows hold carry, more than L if the key spent more.
local function sl_carry(from, to, fp, tp, now)
  local entries, drop
  entries, drop, now = sl_load(from, fp, now)
  local n, keep = #entries, 0
  while keep < n - drop and tonumber(entries[n - keep]) > now - tp.W do keep = keep + 1 end
  if keep == 0 then return end
  carry_copy(from, to)
  if n - keep > 0 then redis.call('LTRIM', to, n - keep, -1) end
  redis.call('PEXPIRE', to, ceildiv(tonumber(entries[n]) + tp.W - now, 1000) + 1000)
end

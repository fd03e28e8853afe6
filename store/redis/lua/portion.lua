-- portion.lua: a region's part of a global token bucket, whose share the
-- region's agent moves (algo/portion.go, which this mirrors). State: one
-- string, "level last held until": tokens in microseconds of refill times
-- thousandths of share (below 0 in debt), the instant they were settled
-- at, the share held (thousandths), and when a share above the region's
-- own (p.own) ends (0: none). A missing key is a fresh part: the own share,
-- full. A part holding less than its own share never expires: a fresh one
-- would make the tokens the region gave up (the other regions were told
-- it holds less); any other expires once full at its own share and past
-- its lease.
local function por_load(key, p, now)
  local v = redis.call('GET', key)
  if not v then return {l = p.D * p.own, t = now, h = p.own, u = 0} end
  local l, t, h, u = string.match(v, '^(%-?%d+) (%-?%d+) (%d+) (%d+)$')
  if not l then return {l = 0, t = now, h = 0, u = 0} end -- unreadable: empty, never fuller
  return {l = tonumber(l), t = tonumber(t), h = tonumber(h), u = tonumber(u)}
end

local function por_refill(st, p, elapsed, share)
  local cap = p.D * share
  if st.l >= cap then return end
  if share > 0 and elapsed >= ceildiv(cap - st.l, share) then
    st.l = cap
    return
  end
  st.l = st.l + elapsed * share
end

-- por_settle refills st to now at the shares in force: a lease that ended
-- since refills at its share until its end and at the own share after.
local function por_settle(st, p, now)
  if now <= st.t then return end
  if st.h > p.own and st.u ~= 0 and st.u < now then
    if st.u > st.t then
      por_refill(st, p, st.u - st.t, st.h)
      st.t = st.u
    end
    st.h, st.u = p.own, 0
    st.l = math.min(st.l, p.D * p.own)
  end
  por_refill(st, p, now - st.t, st.h)
  st.t = now
end

-- por_reset is the time to a full part at the share held.
local function por_reset(st, p)
  if st.h <= 0 then return 0 end
  return ceildiv(math.max(p.D * st.h - st.l, 0), st.h)
end

local function por_wait(st, p, need)
  if st.h <= 0 or need > p.D * st.h then return p.W end
  return ceildiv(need - st.l, st.h)
end

local function por_decide(key, p, now, cost)
  local st = por_load(key, p, now)
  por_settle(st, p, now)
  local unit = p.T * 1000
  local rem = math.floor(st.l / unit)
  if cost == 0 then
    if st.l < 0 then return limited(0, por_wait(st, p, 0), por_reset(st, p)), nil end
    return allowed(rem, por_reset(st, p)), nil
  end
  if cost > p.L then return toolarge(rem, por_reset(st, p)), nil end
  local need = cost * unit
  if st.l < need then return limited(rem, por_wait(st, p, need), por_reset(st, p)), nil end
  st.l = st.l - need
  st.own, st.D = p.own, p.D
  return allowed(math.floor(st.l / unit), por_reset(st, p)), st
end

-- por_write keeps a part that holds less than its own share; any other
-- until it is full and its lease has ended, and a second more (its own
-- time to live: the driver's follows the time to full only).
local function por_write(key, st)
  local v = string.format('%.0f %.0f %.0f %.0f', st.l, st.t, st.h, st.u)
  if st.h < st.own then
    redis.call('SET', key, v)
    return
  end
  local live = por_reset(st, st)
  if st.u ~= 0 then live = math.max(live, st.u - st.t) end
  redis.call('SET', key, v, 'PX', ceildiv(live, 1000) + 1000)
end

local function por_charge(key, p, now, units)
  local st = por_load(key, p, now)
  por_settle(st, p, now)
  st.l, st.own, st.D, st.keeps_ttl = st.l - units * p.T * 1000, p.own, p.D, true
  return st
end

local function por_refund(key, p, now, units)
  local st = por_load(key, p, now)
  por_settle(st, p, now)
  st.l, st.own, st.D, st.keeps_ttl = math.min(st.l + units * p.T * 1000, p.D * st.h), p.own, p.D, true
  return st
end

-- A region's part is its agent's to set: it never carries (the store sends
-- no carry for it).
local function por_carry(from, to, fp, tp, now) end

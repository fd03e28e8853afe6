-- home.lua: one region's exchange of a global rule, on the home store, as
-- one atomic step: the coordinator's decisions (package global,
-- coordinator.go, the model this script is tested against) on the rule's
-- accounts at the home's time. A region's exchange crosses regions: run in
-- one script, it is one round trip and never interrupted by another's.
-- KEYS[1]: the rule's accounts (a hash: key -> accounts); KEYS[2]: the keys
--   some region wants more of (a set); KEYS[3]: when the accounts began
--   (microseconds on the home's clock); KEYS[4]: the regions' own shares
--   the accounts were kept with.
-- ARGV: now in microseconds ("" for the server's TIME), the region, the
--   capacity (thousandths), the lease and the period (microseconds), the
--   accounts' time to live (ms), the most keys wanted elsewhere to name,
--   the number of regions with own shares, then each name and own share,
--   then each ask's key, held and want.
-- Returns {grants, wanted}: for each ask its share and 1 if others want
-- more; the keys not asked that others want more of.
-- Accounts are stored as "region held heldUntil granted grantedUntil want
-- seen" per region, joined by '|', times in microseconds: whole numbers
-- below 2^53, exact in Lua's numbers.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local region, cap = ARGV[2], tonumber(ARGV[3])
local lease, period = tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, maxWanted = tonumber(ARGV[6]), tonumber(ARGV[7])
local stale = lease + period
-- Accounts that began less than a lease ago may have lost grants still
-- running (a home restarted empty, or its accounts deleted): until a lease
-- has passed, no region is granted more than it declares it holds, so the
-- leases the home forgot end before anyone gets their share.
local began = tonumber(redis.call('GET', KEYS[3]))
if not began then
  began = now
  redis.call('SET', KEYS[3], string.format('%d', now), 'PX', ttl)
else
  redis.call('PEXPIRE', KEYS[3], ttl)
end
local fresh = now - began < lease
local own, names = {}, {}
local nown = tonumber(ARGV[8])
local i = 9
for _ = 1, nown do
  own[ARGV[i]] = tonumber(ARGV[i + 1])
  i = i + 2
end
local function ownOf(r) return own[r] or 0 end
-- Regions that disagree on their own shares (a rolling change of the rule)
-- could hold more than the limit between them: the home refuses the
-- exchanges of the shares it was not keeping, until those it keeps have
-- not been used for the accounts' time to live.
local owns = table.concat(ARGV, ' ', 9, 8 + 2 * nown)
local kept = redis.call('GET', KEYS[4])
if kept and kept ~= owns then
  return redis.error_reply('SHARES the regions disagree on the rule\'s own shares: the home keeps "' .. kept .. '", this region has "' .. owns .. '"')
end
redis.call('SET', KEYS[4], owns, 'PX', ttl)

local function decode(s)
  local a = {}
  if not s then return a end
  for entry in string.gmatch(s, '[^|]+') do
    local f = {}
    for x in string.gmatch(entry, '%S+') do f[#f + 1] = x end
    if #f == 7 then
      a[f[1]] = {h = tonumber(f[2]), hu = tonumber(f[3]), g = tonumber(f[4]), gu = tonumber(f[5]), w = tonumber(f[6]), s = tonumber(f[7])}
    end
  end
  return a
end

local function encode(a)
  local rs = {}
  for r in pairs(a) do rs[#rs + 1] = r end
  table.sort(rs)
  local out = {}
  for _, r in ipairs(rs) do
    local c = a[r]
    out[#out + 1] = string.format('%s %d %d %d %d %d %d', r, c.h, c.hu, c.g, c.gu, c.w, c.s)
  end
  return table.concat(out, '|')
end

-- may is the most a share v, above o until u, can be at now.
local function may(v, u, o)
  if v > o and (u == 0 or now >= u) then return o end
  return v
end

local function holding(a, r)
  local c = a[r]
  if not c then return ownOf(r) end
  return math.max(may(c.h, c.hu, ownOf(r)), may(c.g, c.gu, ownOf(r)))
end

local function regionsOf(a)
  local set, out = {}, {}
  for r in pairs(own) do set[r] = true end
  for r in pairs(a) do set[r] = true end
  for r in pairs(set) do out[#out + 1] = r end
  table.sort(out)
  return out
end

local function targets(a)
  local rs = regionsOf(a)
  local want, total = {}, 0
  for _, r in ipairs(rs) do
    local c = a[r]
    want[r] = 0
    if c and now - c.s <= stale then want[r] = c.w end
    total = total + want[r]
  end
  local out = {}
  if total <= cap then
    local slack = cap - total
    for _, r in ipairs(rs) do
      out[r] = want[r]
      local keep = math.min(math.max(holding(a, r) - want[r], 0), slack)
      out[r] = out[r] + keep
      slack = slack - keep
    end
    for _, r in ipairs(rs) do
      local back = math.min(math.max(ownOf(r) - out[r], 0), slack)
      out[r] = out[r] + back
      slack = slack - back
    end
    local ownTotal = 0
    for _, r in ipairs(rs) do ownTotal = ownTotal + ownOf(r) end
    if ownTotal > 0 then
      for _, r in ipairs(rs) do out[r] = out[r] + math.floor(slack * ownOf(r) / ownTotal) end
    end
    return out
  end
  -- Max-min: the smallest wants met whole, the rest share equally.
  table.sort(rs, function(x, y)
    if want[x] ~= want[y] then return want[x] < want[y] end
    return x < y
  end)
  local left, n = cap, #rs
  for _, r in ipairs(rs) do
    local fair = math.floor(left / n)
    out[r] = math.min(want[r], fair)
    left = left - out[r]
    n = n - 1
  end
  return out
end

local function wantedBy(a, t, except)
  for r, v in pairs(t) do
    if r ~= except and v > holding(a, r) then return true end
  end
  return false
end

local function atRest(a)
  for r, c in pairs(a) do
    local o = ownOf(r)
    if may(c.h, c.hu, o) ~= o or may(c.g, c.gu, o) ~= o then return false end
    if c.w > 0 and now - c.s <= stale then return false end
  end
  return true
end

local grants, asked = {}, {}
local o = ownOf(region)
while i + 2 <= #ARGV do
  local key, held, want = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  i = i + 3
  asked[key] = true
  local a = decode(redis.call('HGET', KEYS[1], key) or nil)
  local c = a[region]
  if not c then
    c = {h = 0, hu = 0, g = 0, gu = 0, w = 0, s = 0}
    a[region] = c
  end
  -- What it declares it holds: a share above its own comes from a grant,
  -- whose lease ends by the last one answered.
  c.h, c.hu = held, 0
  if held > o then
    c.hu = c.gu
    if c.hu == 0 or c.hu < now - lease then c.hu = now + lease end
  end
  c.g, c.gu = c.h, c.hu
  c.w, c.s = math.min(math.max(want, 0), cap), now
  local t = targets(a)
  local sum = 0
  for _, r in ipairs(regionsOf(a)) do sum = sum + holding(a, r) end
  local free = cap - sum
  local g = math.max(math.min(t[region] or 0, holding(a, region) + math.max(free, 0)), 0)
  if fresh then g = math.min(g, held) end
  c.g, c.gu = g, 0
  if g > o then c.gu = now + lease end
  local w = wantedBy(a, t, region)
  grants[#grants + 1] = {g, w and 1 or 0}
  if atRest(a) then
    redis.call('HDEL', KEYS[1], key)
    redis.call('SREM', KEYS[2], key)
  else
    redis.call('HSET', KEYS[1], key, encode(a))
    if wantedBy(a, targets(a), nil) then
      redis.call('SADD', KEYS[2], key)
    else
      redis.call('SREM', KEYS[2], key)
    end
  end
end

local wanted = {}
for _, key in ipairs(redis.call('SRANDMEMBER', KEYS[2], maxWanted)) do
  if not asked[key] then
    local a = decode(redis.call('HGET', KEYS[1], key) or nil)
    if wantedBy(a, targets(a), region) then wanted[#wanted + 1] = key end
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return {grants, wanted}

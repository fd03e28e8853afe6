-- take.lua: decides several takes in one atomic step, in order: check all,
-- then write all, or none if any take is refused. When one key is taken
-- twice in the call, each take must see the ones before it, as in the
-- embedded store: the takes are then written as they are decided, each key
-- snapshotted (DUMP, PTTL) before its first write, and the snapshots
-- restored if any take is refused.
-- KEYS[i]: the i-th take's key (all in one hash slot).
-- ARGV[1]: now in microseconds, or "" for the server's TIME.
-- ARGV[2]: "1" to decide without writing anything (a caller's other key
--   already refused), else "0".
-- ARGV[3 + 7*(i-1) ...]: per take: algorithm, T, D, W, L (microseconds and
--   units), cost (negative: give -cost units back), dry run (0 or 1).
-- Returns 6 integers per take: allowed, reason, remaining, retry, reset,
-- delay (microseconds). When nothing is written, an allowed take reports its
-- key as it stands.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local hold = ARGV[2] == '1'
-- The algorithms this script was built with (the store builds one script
-- per algorithm, and one with all of them for mixed takes).
local algos = {
--ALGOS--
}
local seen, sequential = {}, false
for _, key in ipairs(KEYS) do
  if seen[key] then sequential = true end
  seen[key] = true
end
sequential = sequential and not hold
local out, pending, ok, snaps = {}, {}, not hold, {}
for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 7
  local alg = algos[ARGV[a + 1]]
  local p = {T = tonumber(ARGV[a + 2]), D = tonumber(ARGV[a + 3]), W = tonumber(ARGV[a + 4]), L = tonumber(ARGV[a + 5])}
  local cost, dry = tonumber(ARGV[a + 6]), ARGV[a + 7] == '1'
  local r, st
  if cost < 0 then
    -- A refund applies whatever the other takes decide.
    local nst = alg[3](key, p, now, -cost)
    if nst then alg[2](key, nst, ceildiv(p.D + p.W, 1000) + 1000) end
    r = alg[1](key, p, now, 0)
  else
    r, st = alg[1](key, p, now, cost)
    if r[1] == 0 then ok = false end
    if st and not dry then
      pending[#pending + 1] = {alg, key, st, r[5], p, #out}
      if sequential and r[1] == 1 then
        if snaps[key] == nil then snaps[key] = {redis.call('DUMP', key), redis.call('PTTL', key)} end
        alg[2](key, st, ceildiv(r[5], 1000) + 1000)
      end
    end
  end
  for j = 1, 6 do out[#out + 1] = r[j] end
end
if sequential and not ok then
  for key, snap in pairs(snaps) do
    if snap[1] then
      redis.call('RESTORE', key, math.max(snap[2], 0), snap[1], 'REPLACE')
    else
      redis.call('DEL', key)
    end
  end
end
for _, w in ipairs(pending) do
  if ok then
    -- The TTL outlives the time back to idle by a second, so an expired key
    -- answers as a fresh one would.
    if not sequential then w[1][2](w[2], w[3], ceildiv(w[4], 1000) + 1000) end
  else
    local peek = w[1][1](w[2], w[5], now, 0)
    out[w[6] + 3], out[w[6] + 5] = peek[3], peek[5]
  end
end
return out

-- take.lua: decides several takes in one atomic step, in order: check all,
-- then write all, or none if any take is refused. When one key is taken
-- twice in the call, each take must see the ones before it, as in the
-- embedded store: the takes are then written as they are decided, each key
-- snapshotted (DUMP, PTTL) before its first write, and the snapshots
-- restored if any take is refused.
-- KEYS[i]: the i-th take's key (all in one hash slot).
-- ARGV[1]: now in microseconds, or "" for the server's TIME.
-- ARGV[2]: the number of takes (KEYS holds their keys, then the keys of
--   the limits they carry from).
-- ARGV[3]: "1" to decide without writing anything (a caller's other key
--   already refused), else "0".
-- ARGV[4 + 12*(i-1) ...]: per take: algorithm, T, D, W, L (microseconds and
--   units), cost (negative: give -cost units back), dry run (0 or 1),
--   reservation id ("" for none), and for a reservation: its lifetime in
--   microseconds to open it, -1 to settle it at cost, or -2 (without an id)
--   to charge cost whatever the limit and the other takes say; the floor
--   (units the take must leave: it decides as cost + floor, and takes cost);
--   a region's own share of a global limit (thousandths; portion.lua), or 0;
--   the number of limits the key may have been counted under before (c).
-- After the takes' arguments, 4 per such limit, in take order: its T, D, W,
-- L; its key follows the takes' keys in KEYS. A take whose key does not
-- exist (or is the copy left behind when it moved away) moves the state of
-- the first of its c keys that does into its own, converted so that what
-- was spent stays spent (each algorithm's _carry), before it is decided; the
-- key it moved from stays a few seconds for processes that have not seen
-- the change yet (carry_leave in lib.lua).
-- A reservation is a key beside the take's key (same hash slot) holding the
-- units reserved, expiring at the deadline: opened only if every take is
-- admitted, deleted by its settle, which then refunds or charges the
-- difference, so a settle applies at most once. Giving back a take with a
-- reservation id deletes it too (a cancel, or a cluster's give-back).
-- Returns 6 integers per take: allowed, reason, remaining, retry, reset,
-- delay (microseconds). When nothing is written, an allowed take reports its
-- key as it stands.
-- A batch decides several such calls, each as if alone, one after another:
-- ARGV[2] is "b", ARGV[3] the number of calls, and each call is its number
-- of takes, its hold flag ("0" or "1") and its takes' 12 arguments; KEYS
-- holds the calls' keys in order. It returns the calls' integers in order.
-- A call's limits carried from follow its takes, in KEYS and in ARGV, as
-- in a call alone.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- The algorithms this script was built with (the store builds one script
-- per algorithm, and one with all of them for mixed takes).
local algos = {
--ALGOS--
}
-- rewrite writes a refunded or charged state (nil: unchanged) and returns
-- the key's decision after it. Its TTL follows the time back to idle, which
-- a debt can push beyond D + W.
local function rewrite(alg, key, p, now, nst)
  if nst then alg[2](key, nst, 1000) end
  local r = alg[1](key, p, now, 0)
  r[1], r[2], r[4] = 1, 0, 0 -- applied whatever the limit says, in debt or not
  if nst and not nst.keeps_ttl then redis.call('PEXPIRE', key, ceildiv(r[5], 1000) + 1000) end
  return r
end
-- take decides one call: n takes, whose keys are KEYS[k0 + 1 ...] and
-- whose arguments start at ARGV[a0 + 1].
local function take(k0, n, a0, hold)
  local seen, sequential = {}, false
  for i = 1, n do
    local key = KEYS[k0 + i]
    if seen[key] then sequential = true end
    seen[key] = true
  end
  sequential = sequential and not hold
  local out, pending, ok, snaps = {}, {}, not hold, {}
  local carried = 0 -- limits read so far
  for i = 1, n do
    local key = KEYS[k0 + i]
    local a = a0 + (i - 1) * 12
    local alg = algos[ARGV[a + 1]]
    local p = {T = tonumber(ARGV[a + 2]), D = tonumber(ARGV[a + 3]), W = tonumber(ARGV[a + 4]), L = tonumber(ARGV[a + 5]),
      own = tonumber(ARGV[a + 11])}
    local nc = tonumber(ARGV[a + 12])
    -- The key carries from a limit it had when it has no state of its own,
    -- or only the copy left when it moved away (carry_leave).
    local here = nc > 0 and redis.call('EXISTS', key) == 1
    if nc > 0 and (not here or redis.call('EXISTS', carry_mark(key)) == 1) then
      for j = carried + 1, carried + nc do
        local from, c = KEYS[k0 + n + j], a0 + 12 * n + (j - 1) * 4
        if redis.call('EXISTS', from) == 1 and redis.call('EXISTS', carry_mark(from)) == 0 then
          -- A copy left behind is no state of the key's once the state it
          -- left for is found; until then it is all the take knows.
          if here then redis.call('DEL', key, carry_mark(key)) end
          alg[5](from, key, {T = tonumber(ARGV[c + 1]), D = tonumber(ARGV[c + 2]), W = tonumber(ARGV[c + 3]), L = tonumber(ARGV[c + 4])}, p, now)
          carry_leave(from, c)
          break
        end
      end
    end
    carried = carried + nc
    local cost, dry = tonumber(ARGV[a + 6]), ARGV[a + 7] == '1'
    local hid, hold_us = ARGV[a + 8], tonumber(ARGV[a + 9])
    local floor = tonumber(ARGV[a + 10])
    local r, st
    if hid ~= '' and hold_us < 0 then
      -- A settle applies whatever the other takes decide.
      local mk = key .. '~' .. hid
      -- The marker holds the units and the deadline in the script's time, so
      -- that a deadline follows the same clock as the decisions (PX only
      -- collects it).
      local v = redis.call('GET', mk) or ''
      local sp = string.find(v, ' ', 1, true)
      local est, untl = nil, nil
      if sp then est, untl = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)) end
      if est ~= nil and untl ~= nil and now >= untl then
        redis.call('DEL', mk)
        est = nil
      end
      if est == nil then
        r = alg[1](key, p, now, 0)
        r[1], r[2], r[4] = 0, 6, 0 -- no reservation
      else
        redis.call('DEL', mk)
        local nst = nil
        if cost < est then nst = alg[3](key, p, now, est - cost) end
        if cost > est then nst = alg[4](key, p, now, cost - est) end
        r = rewrite(alg, key, p, now, nst)
      end
    elseif hold_us == -2 and cost > 0 then
      -- A charge applies whatever the other takes decide, beyond the limit
      -- if need be (a debt).
      r = rewrite(alg, key, p, now, alg[4](key, p, now, cost))
    elseif cost < 0 then
      -- A refund applies whatever the other takes decide.
      if hid ~= '' then redis.call('DEL', key .. '~' .. hid) end
      r = rewrite(alg, key, p, now, alg[3](key, p, now, -cost))
    else
      if floor > 0 and cost > 0 then
        r = alg[1](key, p, now, cost + floor)
        if r[1] == 1 then r, st = alg[1](key, p, now, cost) end
        r[3] = math.max(r[3] - floor, 0)
      else
        r, st = alg[1](key, p, now, cost)
      end
      if r[1] == 0 then ok = false end
      if st and not dry then
        pending[#pending + 1] = {alg, key, st, r[5], p, #out, hid, hold_us, cost, floor}
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
      if w[7] ~= '' and w[8] > 0 then
        redis.call('SET', w[2] .. '~' .. w[7], string.format('%.0f %.0f', w[9], now + w[8]), 'PX', ceildiv(w[8], 1000))
      end
    else
      local peek = w[1][1](w[2], w[5], now, 0)
      out[w[6] + 3], out[w[6] + 5] = math.max(peek[3] - w[10], 0), peek[5]
    end
  end
  return out, carried
end
if ARGV[2] ~= 'b' then return (take(0, tonumber(ARGV[2]), 3, ARGV[3] == '1')) end
local all, k, a = {}, 0, 4
for _ = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[a])
  local out, m = take(k, n, a + 1, ARGV[a + 1] == '1')
  for _, v in ipairs(out) do all[#all + 1] = v end
  k, a = k + n + m, a + 2 + 12 * n + 4 * m
end
return all

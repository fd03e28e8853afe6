-- shares.lua: reads or sets one key's share of a global limit, for the
-- region's agent (portion.lua keeps the part).
-- KEYS[1]: the part's key.
-- ARGV: now in microseconds ("" for the server's TIME), T, D, W, L, the
--   region's own share, then "" to read, or the share to set and its lease
--   in microseconds (0: none). A set settles the part at the share in force
--   first, then holds the new share (above the own one until now + lease)
--   and drops the tokens above its capacity.
-- Returns the share in force and the lease left (microseconds, 0: none).
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local p = {T = tonumber(ARGV[2]), D = tonumber(ARGV[3]), W = tonumber(ARGV[4]), L = tonumber(ARGV[5]), own = tonumber(ARGV[6])}
local st = por_load(KEYS[1], p, now)
if ARGV[7] ~= '' then
  por_settle(st, p, now)
  local share, lease = math.min(math.max(tonumber(ARGV[7]), 0), 1000), tonumber(ARGV[8])
  st.h, st.u = share, 0
  if share > p.own then st.u = now + lease end
  st.l = math.min(st.l, p.D * share)
  st.own, st.D = p.own, p.D
  por_write(KEYS[1], st)
end
local h, left = st.h, 0
if h > p.own and st.u ~= 0 then
  if now >= st.u then h = p.own else left = st.u - now end
end
return {h, left}

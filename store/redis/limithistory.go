package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice"
)

// The processes on one Redis share which limits each rule's keys are
// counted under lately, so that one that did not see a limit change — it
// started after it, or reloaded its rules later than another — still
// carries its keys' usage (engine.LimitHistory). One hash, in one slot:
//
//	{sluice-limits}   field: <rule> NUL <limit>, value: when a process last
//	                  counted the rule's keys under it (Unix ms)
//
// Each process writes the limits it counts under every few seconds and
// reads the others', with Redis's clock; fields not written for a week are
// dropped, and at most maxLimitFields are kept.

// LimitHistory is the store's record of the limits rules are counted
// under.
type LimitHistory struct {
	s   *Store
	key string
}

// maxLimitFields bounds the record (see Note).
const maxLimitFields = 10_000

// limitFieldLife is how long a field no process writes is kept.
const limitFieldLife = 7 * 24 * time.Hour

// LimitHistory returns the record kept in s's Redis.
func (s *Store) LimitHistory() *LimitHistory {
	return &LimitHistory{s: s, key: s.prefix + "{sluice-limits}"}
}

var (
	// KEYS[1]: the hash; ARGV: the fields to note. Times are Redis's (ms),
	// so that processes whose clocks differ agree. When the hash holds more
	// than ARGV[1] fields, those that are not a limit, dated in the future,
	// or not written for ARGV[2] ms go, then the oldest.
	limitsNote = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 3, #ARGV do redis.call('HSET', KEYS[1], ARGV[i], now) end
if redis.call('HLEN', KEYS[1]) <= tonumber(ARGV[1]) then return 0 end
local kept = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local at = tonumber(all[i + 1])
  if not at or at > now + 60000 or now - at > tonumber(ARGV[2]) or not string.find(all[i], '^[^%z]+%z%d+,%d+,%d+,%d+,[01],%d+$') then
    redis.call('HDEL', KEYS[1], all[i])
  else
    kept[#kept + 1] = {all[i], at}
  end
end
local over = #kept - tonumber(ARGV[1])
if over > 0 then
  table.sort(kept, function(a, b) return a[2] < b[2] end)
  for i = 1, over do redis.call('HDEL', KEYS[1], kept[i][1]) end
end
return 0
`)
	limitsRead = rueidis.NewLuaScript(`
local t = redis.call('TIME')
return {tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), redis.call('HGETALL', KEYS[1])}
`)
)

// Note records that each rule's keys are counted under its limits now
// (Redis's time). The record keeps at most maxLimitFields fields: past it,
// fields that are not limits, dated ahead, or a week old go first, then
// the oldest, so junk never keeps a process's limits out.
func (h *LimitHistory) Note(ctx context.Context, limits map[string][]sluice.Limit, _ time.Time) error {
	c := h.s.conn()
	if c == nil {
		return h.s.notConnected()
	}
	args := []string{strconv.Itoa(maxLimitFields), strconv.FormatInt(limitFieldLife.Milliseconds(), 10)}
	for rule, ls := range limits {
		for _, l := range ls {
			args = append(args, rule+"\x00"+encodeLimit(l))
		}
	}
	if err := limitsNote.Exec(ctx, c, []string{h.key}, args).Error(); err != nil {
		return fmt.Errorf("redis: limit history: %w", err)
	}
	return nil
}

// Recent returns, for each rule, the limits its keys were counted under
// and when they last were, on this process's clock (Redis's times moved by
// the difference of the two clocks).
func (h *LimitHistory) Recent(ctx context.Context) (map[string]map[sluice.Limit]time.Time, error) {
	c := h.s.conn()
	if c == nil {
		return nil, h.s.notConnected()
	}
	vals, err := limitsRead.Exec(ctx, c, []string{h.key}, nil).ToArray()
	if err != nil || len(vals) != 2 {
		return nil, fmt.Errorf("redis: limit history: %w", err)
	}
	local := time.Now()
	nowStr, err := vals[0].ToString()
	if err != nil {
		return nil, fmt.Errorf("redis: limit history: %w", err)
	}
	redisNow, err := strconv.ParseInt(nowStr, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("redis: limit history: %w", err)
	}
	m, err := vals[1].AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("redis: limit history: %w", err)
	}
	out := map[string]map[sluice.Limit]time.Time{}
	for f, v := range m {
		rule, enc, ok := strings.Cut(f, "\x00")
		l, lok := decodeLimit(enc)
		ms, err := strconv.ParseInt(v, 10, 64)
		if !ok || !lok || err != nil || ms > redisNow {
			continue // not ours, or dated ahead: never trusted
		}
		if out[rule] == nil {
			out[rule] = map[sluice.Limit]time.Time{}
		}
		out[rule][l] = local.Add(-time.Duration(redisNow-ms) * time.Millisecond)
	}
	return out, nil
}

// encodeLimit writes a limit as rate,period(ns),burst,algorithm,calendar,portion.
func encodeLimit(l sluice.Limit) string {
	cal := 0
	if l.Calendar {
		cal = 1
	}
	return fmt.Sprintf("%d,%d,%d,%d,%d,%d", l.Rate, int64(l.Period), l.Burst, l.Algorithm, cal, l.Portion)
}

func decodeLimit(s string) (sluice.Limit, bool) {
	f := strings.Split(s, ",")
	if len(f) != 6 {
		return sluice.Limit{}, false
	}
	var v [6]int64
	for i := range f {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return sluice.Limit{}, false
		}
		v[i] = n
	}
	l := sluice.Limit{Rate: v[0], Period: time.Duration(v[1]), Burst: v[2], Algorithm: sluice.Algorithm(v[3]), Calendar: v[4] == 1, Portion: v[5]}
	return l, l.Validate() == nil
}

package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

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
// reads the others'; fields not written for a week are dropped, and at
// most maxLimitFields are kept.

// LimitHistory is the store's record of the limits rules are counted
// under.
type LimitHistory struct {
	s   *Store
	key string
}

// maxLimitFields bounds the record: past it, a process notes nothing new
// until old fields are dropped.
const maxLimitFields = 10_000

// limitFieldLife is how long a field no process writes is kept.
const limitFieldLife = 7 * 24 * time.Hour

// LimitHistory returns the record kept in s's Redis.
func (s *Store) LimitHistory() *LimitHistory {
	return &LimitHistory{s: s, key: s.prefix + "{sluice-limits}"}
}

// Note records that rule's keys are counted under each of limits at now,
// and drops the fields no process wrote for a week.
func (h *LimitHistory) Note(ctx context.Context, limits map[string][]sluice.Limit, now time.Time) error {
	c := h.s.conn()
	if c == nil {
		return h.s.notConnected()
	}
	n, err := c.Do(ctx, c.B().Hlen().Key(h.key).Build()).AsInt64()
	if err != nil {
		return fmt.Errorf("redis: limit history: %w", err)
	}
	if n >= maxLimitFields {
		h.prune(ctx, now)
		return nil
	}
	cmd := c.B().Hset().Key(h.key).FieldValue()
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	count := 0
	for rule, ls := range limits {
		for _, l := range ls {
			cmd = cmd.FieldValue(rule+"\x00"+encodeLimit(l), ms)
			count++
		}
	}
	if count == 0 {
		return nil
	}
	if err := c.Do(ctx, cmd.Build()).Error(); err != nil {
		return fmt.Errorf("redis: limit history: %w", err)
	}
	return nil
}

// Recent returns, for each rule, the limits its keys were counted under
// and when they last were.
func (h *LimitHistory) Recent(ctx context.Context) (map[string]map[sluice.Limit]time.Time, error) {
	c := h.s.conn()
	if c == nil {
		return nil, h.s.notConnected()
	}
	m, err := c.Do(ctx, c.B().Hgetall().Key(h.key).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("redis: limit history: %w", err)
	}
	out := map[string]map[sluice.Limit]time.Time{}
	for f, v := range m {
		rule, enc, ok := strings.Cut(f, "\x00")
		l, lok := decodeLimit(enc)
		ms, err := strconv.ParseInt(v, 10, 64)
		if !ok || !lok || err != nil {
			continue // not ours: never trusted
		}
		if out[rule] == nil {
			out[rule] = map[sluice.Limit]time.Time{}
		}
		out[rule][l] = time.UnixMilli(ms)
	}
	return out, nil
}

func (h *LimitHistory) prune(ctx context.Context, now time.Time) {
	all, err := h.Recent(ctx)
	if err != nil {
		return
	}
	c := h.s.conn()
	if c == nil {
		return
	}
	for rule, ls := range all {
		for l, at := range ls {
			if now.Sub(at) > limitFieldLife {
				c.Do(ctx, c.B().Hdel().Key(h.key).Field(rule+"\x00"+encodeLimit(l)).Build())
			}
		}
	}
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

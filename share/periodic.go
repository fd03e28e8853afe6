package share

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice"
)

// sync mode counts locally and tells the store at most once per interval
// per key. A gateway admits while its pending count fits in the units the
// store had left when it last synced; at the next take after the interval
// (and every interval in the background) it sends the pending count as one
// take and reads the store's remaining units back. Between syncs each
// gateway spends the same remaining units without knowing of the others,
// so the gateways together can pass the limit by about what the others
// admit in one interval: rate x interval x (gateways - 1). Pending counts
// the store refuses (the limit was passed meanwhile) are sent as far as
// they fit; the rest is the over-admission.

type count struct {
	mu        sync.Mutex
	pending   int64 // admitted here, not yet sent
	remaining int64 // the store's remaining units at the last sync
	synced    int64 // when; 0 before the first
	reset     time.Duration
	used      int64
	rule, key string
	limit     sluice.Limit
	interval  time.Duration
}

type periodic struct {
	s   *Store
	mu  sync.Mutex
	m   map[leaseKey]*count
	max int
}

func newPeriodic(s *Store, max int) *periodic {
	return &periodic{s: s, m: map[leaseKey]*count{}, max: max}
}

func (pc *periodic) get(tk *sluice.Take, p *plan) *count {
	k := leaseKey{tk.Rule, tk.Key, p.limit}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if c := pc.m[k]; c != nil {
		return c
	}
	if len(pc.m) >= pc.max {
		return nil
	}
	k.rule, k.key = strings.Clone(k.rule), strings.Clone(k.key)
	c := &count{rule: k.rule, key: k.key, limit: p.limit, interval: p.sh.Interval}
	pc.m[k] = c
	return c
}

// take decides a take of a sync rule.
func (pc *periodic) take(ctx context.Context, tk *sluice.Take, p *plan, now int64, d *sluice.Decision) (bool, error) {
	c := pc.get(tk, p)
	if c == nil { // too many keys: decided exactly
		one := [1]sluice.Take{*tk}
		one[0].Limit = p.limit
		var out [1]sluice.Decision
		err := pc.s.call(ctx, one[:], out[:])
		*d = out[0]
		return false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used = now
	if c.synced == 0 || now-c.synced >= int64(c.interval) {
		if err := pc.syncLocked(ctx, c, now); err != nil {
			return false, err
		}
	}
	if c.pending+tk.Cost <= c.remaining {
		c.pending += tk.Cost
		*d = sluice.Decision{Allowed: true, Remaining: c.remaining - c.pending, ResetAfter: c.reset}
		return true, nil
	}
	reason := sluice.ReasonLimited
	if tk.Cost > p.limit.Capacity() {
		reason = sluice.ReasonTooLarge
	}
	// Retry at the next sync, when the store's count is read again.
	retry := time.Duration(c.synced + int64(c.interval) - now)
	if reason == sluice.ReasonTooLarge {
		retry = 0
	}
	*d = sluice.Decision{Reason: reason, Remaining: max(c.remaining-c.pending, 0), RetryAfter: max(retry, time.Millisecond), ResetAfter: c.reset}
	return false, nil
}

// giveBack takes back units of a refused call.
func (pc *periodic) giveBack(tk *sluice.Take, p *plan, units int64) {
	if c := pc.get(tk, p); c != nil {
		c.mu.Lock()
		c.pending = max(c.pending-units, 0)
		c.mu.Unlock()
	}
}

// syncLocked sends c's pending count and reads the store's remaining units.
// c.mu is held.
func (pc *periodic) syncLocked(ctx context.Context, c *count, now int64) error {
	one := [1]sluice.Take{{Rule: c.rule, Key: c.key, Limit: c.limit, Cost: c.pending}}
	var out [1]sluice.Decision
	if err := pc.s.call(ctx, one[:], out[:]); err != nil {
		return err
	}
	if !out[0].Allowed && c.pending > 0 {
		// The store cannot take it all: send what fits; the rest was
		// admitted over the limit.
		if fit := out[0].Remaining; fit > 0 {
			one[0].Cost = fit
			if err := pc.s.call(ctx, one[:], out[:]); err != nil {
				return err
			}
		}
		out[0].Remaining = 0
	}
	c.pending, c.remaining, c.synced, c.reset = 0, out[0].Remaining, now, out[0].ResetAfter
	return nil
}

// flush syncs the keys with pending counts whose interval has passed (all
// of them, on shutdown), concurrently so a store that pipelines, such as
// the Redis store, sends them together; and forgets keys unused for a
// minute.
func (pc *periodic) flush(ctx context.Context, now int64, all bool) {
	pc.mu.Lock()
	var due []*count
	for k, c := range pc.m {
		c.mu.Lock()
		if c.pending > 0 && (all || now-c.synced >= int64(c.interval)) {
			due = append(due, c)
		} else if c.pending == 0 && now-c.used > int64(time.Minute) {
			delete(pc.m, k)
		}
		c.mu.Unlock()
	}
	pc.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, c := range due {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c.mu.Lock()
			pc.syncLocked(ctx, c, now)
			c.mu.Unlock()
		})
	}
	wg.Wait()
}

package share

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice"
)

// A lease is units taken from the shared store in one atomic call (the
// store debits the whole batch) and spent locally. Leasing never admits
// more than the limit: every unit spent was debited from the store first,
// and a unit given back is one that was never spent. What it costs is
// under-admission: units held on one gateway's lease cannot serve a request
// on another until they go back, after the lease's time to live (1 s by
// default), at shutdown, or when a request's other rule refuses. Stats
// reports them.
//
// The batch adapts. It starts small, at the gateways' fair share of a
// quarter of the burst; doubles (up to the rule's batch) each time a lease
// is spent before it expires, since the key is hot; halves when a lease
// expires with units left; and never exceeds the store's remaining units
// divided by the gateways, so near the limit it shrinks to 1 and few units
// are stranded. A lease on a fixed window also ends with its window, so a
// unit leased in one window is never spent in the next.

type leaseKey struct {
	rule, key string
	limit     sluice.Limit
}

type lease struct {
	mu        sync.Mutex
	units     int64 // held locally, already debited from the store
	expires   int64 // when held units go back
	batch     int64 // the next batch
	remaining int64 // the store's remaining units after the last batch
	reset     int64 // the store's reset time (absolute) after the last batch
	used      int64 // last use
	// After the store refuses a refill, takes that the held units cannot
	// serve are refused here until the store said to retry, as the deny
	// cache does for exact takes.
	deniedUntil int64
	denied      sluice.Decision
}

type leases struct {
	s   *Store
	mu  sync.Mutex
	m   map[leaseKey]*lease
	max int
}

func newLeases(s *Store, max int) *leases { return &leases{s: s, m: map[leaseKey]*lease{}, max: max} }

// get returns the lease of (rule, key, limit), or nil if the table is full.
func (ls *leases) get(tk *sluice.Take, l sluice.Limit, now int64) *lease {
	k := leaseKey{tk.Rule, tk.Key, l}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if le := ls.m[k]; le != nil {
		return le
	}
	if len(ls.m) >= ls.max {
		return nil
	}
	k.rule, k.key = strings.Clone(k.rule), strings.Clone(k.key) // the caller's key may be a reused buffer
	le := &lease{}
	ls.m[k] = le
	return le
}

// take spends cost units of tk's lease, refilling it from the store when it
// runs short. It reports whether it took the units (to undo on a refusal).
func (ls *leases) take(ctx context.Context, tk *sluice.Take, p *plan, now int64, d *sluice.Decision) (bool, error) {
	s := ls.s
	le := ls.get(tk, p.limit, now)
	if le == nil { // too many leases: this key is decided exactly
		one := [1]sluice.Take{*tk}
		one[0].Limit = p.limit
		var out [1]sluice.Decision
		err := s.call(ctx, one[:], out[:])
		*d = out[0]
		return false, err // taken in the store: a refusal elsewhere refunds it there
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	le.used = now
	if le.units > 0 && now >= le.expires {
		if err := ls.giveBackLocked(ctx, tk.Rule, tk.Key, p.limit, le); err != nil {
			return false, err
		}
		le.batch = max(le.batch/2, 1) // it expired unspent: smaller next time
	}
	if le.units >= tk.Cost {
		le.units -= tk.Cost
		ls.decision(le, tk.Cost, now, d)
		return true, nil
	}
	if now < le.deniedUntil {
		*d = le.denied
		d.RetryAfter = time.Duration(le.deniedUntil - now)
		d.Remaining = le.units
		return false, nil
	}
	if le.units == 0 && le.expires > now && le.batch > 0 {
		le.batch = min(le.batch*2, p.sh.Batch) // spent before it expired: hot
	}
	n := 1
	if s.o.Gateways != nil {
		n = max(s.o.Gateways(), 1)
	}
	if le.batch == 0 {
		le.batch = min(p.sh.Batch, max(p.limit.Capacity()/int64(4*n), 1))
		le.remaining = p.limit.Capacity()
	}
	need := tk.Cost - le.units
	batch := max(need, min(le.batch, le.remaining/int64(n)))
	for {
		one := [1]sluice.Take{{Rule: tk.Rule, Key: tk.Key, Limit: p.limit, Cost: batch}}
		var out [1]sluice.Decision
		if err := s.call(ctx, one[:], out[:]); err != nil {
			return false, err
		}
		if out[0].Allowed {
			le.units += batch - tk.Cost
			le.remaining = out[0].Remaining
			le.reset = now + int64(out[0].ResetAfter)
			ttl := int64(p.sh.Interval)
			if p.limit.Algorithm == sluice.FixedWindow && out[0].ResetAfter > 0 {
				ttl = min(ttl, int64(out[0].ResetAfter)) // never spent in the next window
			}
			le.expires = now + ttl
			ls.decision(le, 0, now, d)
			if le.units == 0 && le.remaining < le.batch && p.limit.Algorithm != sluice.FixedWindow {
				// The key is at its limit: the store refills slower than this
				// gateway spends. Rather than one store call per unit as it
				// refills, wait for a batch to build up, as after a refusal.
				wait := refillWait(le.batch, p.limit, n)
				le.deniedUntil = now + wait
				le.denied = sluice.Decision{Reason: sluice.ReasonLimited, ResetAfter: out[0].ResetAfter}
			}
			return true, nil
		}
		le.remaining = out[0].Remaining
		if batch == need || out[0].Reason == sluice.ReasonTooLarge {
			*d = out[0]
			d.Remaining += le.units
			if out[0].Reason == sluice.ReasonLimited && out[0].RetryAfter > 0 {
				// Wait for a batch to refill, not one unit: on a key held at
				// its limit, refilling unit by unit would cost a store call
				// per unit. A wait of at most capacity / (2N) units of refill
				// lets the store hold what refills meanwhile (under its
				// burst), so nothing is lost to the wait.
				wait := refillWait(le.batch, p.limit, n)
				le.deniedUntil, le.denied = now+max(int64(out[0].RetryAfter), wait), out[0]
				d.RetryAfter = time.Duration(le.deniedUntil - now) // the answer names the wait it starts
			}
			return false, nil
		}
		// Take what the store has, if it serves this request.
		batch = max(need, min(out[0].Remaining, batch-1))
	}
}

// refillWait is how long a gateway at a key's limit waits before asking the
// store again, in nanoseconds: the refill of its batch, or of capacity / 2N
// units if that is less (at least one unit's).
func refillWait(batch int64, l sluice.Limit, n int) int64 {
	return min(batch, max(l.Capacity()/int64(2*n), 1)) * int64(l.Interval())
}

// decision reports a lease's state: the store's remaining units plus the
// ones held here.
func (ls *leases) decision(le *lease, _ int64, now int64, d *sluice.Decision) {
	*d = sluice.Decision{Allowed: true, Remaining: le.remaining + le.units, ResetAfter: time.Duration(max(le.reset-now, 0))}
}

// giveBack returns units of a refused call to the lease they came from.
func (ls *leases) giveBack(tk *sluice.Take, p *plan, units int64) {
	if le := ls.get(tk, p.limit, 0); le != nil {
		le.mu.Lock()
		le.units += units
		le.mu.Unlock()
	}
}

// forget drops the refusal remembered for (rule, key), after a refund or a
// reset.
func (ls *leases) forget(rule, key string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for k, le := range ls.m {
		if k.rule == rule && k.key == key {
			le.mu.Lock()
			le.deniedUntil = 0
			le.mu.Unlock()
		}
	}
}

// giveBackLocked refunds a lease's held units to the store. le.mu is held.
func (ls *leases) giveBackLocked(ctx context.Context, rule, key string, l sluice.Limit, le *lease) error {
	one := [1]sluice.Take{{Rule: rule, Key: key, Limit: l, Cost: -le.units}}
	var out [1]sluice.Decision
	if err := ls.s.call(ctx, one[:], out[:]); err != nil {
		return err
	}
	le.units = 0
	le.remaining = out[0].Remaining
	return nil
}

// expire gives back the units of expired leases (of all of them, on
// shutdown) and forgets leases unused for a minute.
func (ls *leases) expire(ctx context.Context, now int64, all bool) {
	ls.mu.Lock()
	keys := make([]leaseKey, 0, len(ls.m))
	for k := range ls.m {
		keys = append(keys, k)
	}
	ls.mu.Unlock()
	for _, k := range keys {
		ls.mu.Lock()
		le := ls.m[k]
		ls.mu.Unlock()
		if le == nil {
			continue
		}
		le.mu.Lock()
		if le.units > 0 && (all || now >= le.expires) {
			if ls.giveBackLocked(ctx, k.rule, k.key, k.limit, le) == nil {
				le.batch = max(le.batch/2, 1)
			}
		}
		idle := le.units == 0 && now-le.used > int64(time.Minute)
		le.mu.Unlock()
		if idle {
			ls.mu.Lock()
			delete(ls.m, k)
			ls.mu.Unlock()
		}
	}
}

// held returns the units held on leases and the number of leases.
func (ls *leases) held() (units int64, n int) {
	ls.mu.Lock()
	all := make([]*lease, 0, len(ls.m))
	for _, le := range ls.m {
		all = append(all, le)
	}
	ls.mu.Unlock()
	for _, le := range all {
		le.mu.Lock()
		units += le.units
		le.mu.Unlock()
	}
	return units, len(all)
}

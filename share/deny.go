package share

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// The deny cache answers a key that the store has just refused, until the
// time the store said to retry, without asking the store again: a client
// hammering one key costs about one store call per retry period, not one per
// request.
//
// It never admits: it only refuses, and only what the store would refuse.
// A refusal of cost c at now with RetryAfter r means the key cannot take c
// before now + r unless units come back; takes only add to the key, so until
// then the same or a larger cost is refused too. Units come back by refunds
// and by a reload that changes the limit: a refund through this store drops
// the key's entry, and a changed limit is another entry. A refund made by
// another gateway is not seen here: this gateway may then refuse a little
// longer than it had to (under-admission, never over-admission). The other
// rules of a request refused from the cache are asked in a dry run, so
// their statuses are real.

type denyEntry struct {
	until, resetAt int64
	cost           int64
	remaining      int64
}

type denyCache struct {
	mu   sync.Mutex
	m    map[leaseKey]denyEntry
	max  int
	hits atomic.Uint64
	off  bool
}

func newDenyCache(max int) *denyCache { return &denyCache{m: map[leaseKey]denyEntry{}, max: max} }

// check answers tk from the cache if the store refused it until later.
func (c *denyCache) check(tk *sluice.Take, now int64) (sluice.Decision, bool) {
	if c.off || tk.Cost <= 0 || tk.DryRun || tk.Settle {
		return sluice.Decision{}, false
	}
	c.mu.Lock()
	e, ok := c.m[leaseKey{tk.Rule, tk.Key, tk.Limit}]
	c.mu.Unlock()
	if !ok || now >= e.until || tk.Cost < e.cost {
		return sluice.Decision{}, false
	}
	c.hits.Add(1)
	return sluice.Decision{
		Reason: sluice.ReasonLimited, Remaining: e.remaining,
		RetryAfter: time.Duration(e.until - now), ResetAfter: time.Duration(max(e.resetAt-now, 0)),
	}, true
}

// learn records the store's answer to tk.
func (c *denyCache) learn(tk *sluice.Take, d *sluice.Decision, now int64) {
	if c.off || tk.DryRun || tk.Cost == 0 || tk.Floor > 0 {
		// A refusal above a floor (a lower priority tier) says nothing of
		// the tiers above it: not learnt.
		return
	}
	k := leaseKey{tk.Rule, tk.Key, tk.Limit}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.Allowed || tk.Cost < 0 || d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0 {
		delete(c.m, k) // units came back, or the key admits
		return
	}
	if len(c.m) >= c.max {
		for k2, e := range c.m {
			if now >= e.until {
				delete(c.m, k2)
			}
		}
		if len(c.m) >= c.max {
			return
		}
	}
	k.rule, k.key = strings.Clone(k.rule), strings.Clone(k.key)
	c.m[k] = denyEntry{until: now + int64(d.RetryAfter), resetAt: now + int64(d.ResetAfter), cost: tk.Cost, remaining: d.Remaining}
}

// forget drops every entry of (rule, key).
func (c *denyCache) forget(rule, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if k.rule == rule && k.key == key {
			delete(c.m, k)
		}
	}
}

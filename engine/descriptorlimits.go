package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// DefaultMaxDescriptorLimits bounds the distinct descriptor limits an
// engine counts at once (see descriptorLimits).
const DefaultMaxDescriptorLimits = 256

// LimitDropper is implemented by stores that keep state per distinct limit,
// such as the embedded store (a table per limit), and can free it.
type LimitDropper interface {
	DropLimit(rule string, l sluice.Limit)
}

// descriptorLimits bounds the distinct limits that Envoy's descriptor
// limits (the limit a descriptor carries, counted in place of its rule's)
// bring in. Each distinct limit costs the embedded store a table, and the
// limit comes with the request, so without a bound a client that can shape
// descriptors could grow memory without end. At most max distinct
// descriptor limits are counted at once; a new one first evicts those idle for
// longer than their period (their counts are back to full, so dropping them
// changes no answer), and if none is idle, the descriptor is answered by its
// configured rule instead (or not limited, if it has none) and the refusal is
// counted.
type descriptorLimits struct {
	mu      sync.Mutex
	max     int
	live    map[limitKey]*atomic.Int64 // last use, ns since the engine's start
	start   time.Time
	refused atomic.Uint64
	drop    LimitDropper
}

type limitKey struct {
	rule  string
	limit sluice.Limit
}

func newDescriptorLimits(max int, drop LimitDropper) *descriptorLimits {
	if max <= 0 {
		max = DefaultMaxDescriptorLimits
	}
	return &descriptorLimits{max: max, live: map[limitKey]*atomic.Int64{}, start: time.Now(), drop: drop}
}

// admit reports whether a descriptor limit l for rule may be counted now.
func (o *descriptorLimits) admit(rule string, l sluice.Limit) bool {
	now := int64(time.Since(o.start))
	k := limitKey{rule, l}
	o.mu.Lock()
	defer o.mu.Unlock()
	if last, ok := o.live[k]; ok {
		last.Store(now)
		return true
	}
	if len(o.live) >= o.max {
		for k2, last := range o.live {
			if now-last.Load() > int64(k2.limit.Period)+int64(time.Second) {
				delete(o.live, k2)
				if o.drop != nil {
					o.drop.DropLimit(k2.rule, k2.limit)
				}
			}
		}
	}
	if len(o.live) >= o.max {
		o.refused.Add(1)
		return false
	}
	last := new(atomic.Int64)
	last.Store(now)
	o.live[k] = last
	return true
}

// DescriptorLimitStats reports how many distinct descriptor limits are
// counted now, and how many descriptors were answered by their configured rule
// because the bound was reached.
func (e *Engine) DescriptorLimitStats() (live int, refused uint64) {
	e.descLimits.mu.Lock()
	defer e.descLimits.mu.Unlock()
	return len(e.descLimits.live), e.descLimits.refused.Load()
}

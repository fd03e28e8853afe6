package global

import (
	"sync"
	"sync/atomic"
)

// Demand is what a process's decisions asked of global rules' keys since
// the runner last took it: units asked, and units refused for want of
// share. The region's agent reads the demand of every process of the
// region (Pool), so the share it asks for follows the region's traffic,
// not one gateway's.
//
// Outside input names the keys, so Demand keeps at most a bound of them
// between two takes; a decision for a key past the bound goes uncounted
// (Dropped), and the key keeps the share it has.
type Demand struct {
	max     int
	mu      sync.Mutex
	n       int
	rules   map[string]map[string]*Count
	dropped atomic.Uint64
}

// Count is one key's demand.
type Count struct {
	Key          string
	Asked, Short int64
}

// NewDemand returns a Demand that keeps at most maxKeys keys between takes
// (10,000 when maxKeys <= 0).
func NewDemand(maxKeys int) *Demand {
	if maxKeys <= 0 {
		maxKeys = 10_000
	}
	return &Demand{max: maxKeys, rules: map[string]map[string]*Count{}}
}

// Add counts a decision of cost units for key under rule.
func (d *Demand) Add(rule, key string, cost int64, allowed bool) {
	if cost <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := d.rules[rule]
	c := keys[key]
	if c == nil {
		if d.n >= d.max {
			d.dropped.Add(1)
			return
		}
		if keys == nil {
			keys = map[string]*Count{}
			d.rules[rule] = keys
		}
		c = &Count{Key: key}
		keys[key] = c
		d.n++
	}
	c.Asked += cost
	if !allowed {
		c.Short += cost
	}
}

// Take returns the demand counted since the last take, by rule, and starts
// counting afresh.
func (d *Demand) Take() map[string][]Count {
	d.mu.Lock()
	rules := d.rules
	d.rules, d.n = map[string]map[string]*Count{}, 0
	d.mu.Unlock()
	out := make(map[string][]Count, len(rules))
	for rule, keys := range rules {
		l := make([]Count, 0, len(keys))
		for _, c := range keys {
			l = append(l, *c)
		}
		out[rule] = l
	}
	return out
}

// Dropped is how many decisions found the bound reached and went uncounted.
func (d *Demand) Dropped() uint64 { return d.dropped.Load() }

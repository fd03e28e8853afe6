package global

import (
	"hash/maphash"
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
	shards  [demandShards]demandShard
	dropped atomic.Uint64
}

// demandShards spreads the keys over locks: every decision of a global
// rule counts, and one lock would queue a gateway's decisions behind it.
const demandShards = 32

type demandShard struct {
	mu   sync.Mutex
	max  int
	keys map[demandKey]*Count
	_    [40]byte // a shard to a cache line
}

type demandKey struct{ rule, key string }

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
	d := &Demand{}
	for i := range d.shards {
		d.shards[i] = demandShard{max: max(maxKeys/demandShards, 1), keys: map[demandKey]*Count{}}
	}
	return d
}

// Add counts a decision of cost units for key under rule.
func (d *Demand) Add(rule, key string, cost int64, allowed bool) {
	if cost <= 0 {
		return
	}
	sh := &d.shards[maphash.String(seed, key)%demandShards]
	k := demandKey{rule, key}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.keys[k]
	if c == nil {
		if len(sh.keys) >= sh.max {
			d.dropped.Add(1)
			return
		}
		c = &Count{Key: key}
		sh.keys[k] = c
	}
	c.Asked += cost
	if !allowed {
		c.Short += cost
	}
}

var seed = maphash.MakeSeed()

// Take returns the demand counted since the last take, by rule, and starts
// counting afresh.
func (d *Demand) Take() map[string][]Count {
	out := map[string][]Count{}
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		keys := sh.keys
		sh.keys = make(map[demandKey]*Count, len(keys))
		sh.mu.Unlock()
		for k, c := range keys {
			out[k.rule] = append(out[k.rule], *c)
		}
	}
	return out
}

// Dropped is how many decisions found the bound reached and went uncounted.
func (d *Demand) Dropped() uint64 { return d.dropped.Load() }

package memory

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// shardBits sets the number of shards per table: 2^7 = 128 locks, so that
// two cores rarely meet on one, while an empty rule costs only a few kB.
const (
	shardBits = 7
	numShards = 1 << shardBits
	minSlots  = 8
)

// Load factor: a shard grows (or compacts away its dead slots) once it is
// 3/4 full. Linear probing stays short at that load: about 2.5 slots for a
// key that is present and 8.5 for one that is not.
const maxLoadNum, maxLoadDen = 3, 4

// table holds one rule's keys: numShards open-addressing hash tables with
// linear probing, each under its own mutex. A slot keeps a 64-bit hash of the
// key, never the key itself, so memory per key is 8 bytes plus the state and
// secrets never stay in memory (see the package doc on collisions).
type table[C any, P cellOps[C]] struct {
	m         tableMeta // id, rule and limit
	params    algo.Params
	seed      maphash.Seed
	maxPer    int // most keys a shard may hold
	maxSlots  int // a shard's largest slot array, a power of two
	evictions atomic.Uint64
	overflows atomic.Uint64 // takes answered from the overflow cell
	shards    [numShards]shard[C]

	// overflow is the shared, strict state of the keys that found their
	// shard full of limited keys (see bound). Its lock is taken after any
	// shard lock and never held while taking one.
	overflowMu sync.Mutex
	overflow   slot[C]
}

type slot[C any] struct {
	fp uint64 // hash of the key with the low bit set; 0 marks an empty slot
	c  C
}

type shard[C any] struct {
	mu    sync.Mutex
	slots []slot[C] // length is a power of two
	count int       // occupied slots, live or dead
	full  int64     // until then, the shard is full of limited keys
	_     [64 - 8 - 24 - 8 - 8]byte
}

func newTable[C any, P cellOps[C]](id uint64, rule string, l sluice.Limit, p algo.Params, seed maphash.Seed, maxKeys int) *table[C, P] {
	t := &table[C, P]{m: tableMeta{id: id, rule: rule, limit: l}, params: p, seed: seed}
	t.maxPer, t.maxSlots = shardBounds(maxKeys)
	P(&t.overflow.c).fresh(&p, 0)
	return t
}

// overflowed is the slot index lookup returns for a key that must use the
// table's overflow cell.
const overflowed = -1

// cell returns key fp's cell (see lookup) and whether it is the shared
// overflow cell, whose lock the caller must then hold while using it.
func (t *table[C, P]) cell(sh *shard[C], fp uint64, now int64) (P, bool) {
	if i := t.lookup(sh, fp, now); i != overflowed {
		return P(&sh.slots[i].c), false
	}
	t.overflows.Add(1)
	return P(&t.overflow.c), true
}

// shardBounds splits a table's key bound across its shards: each holds at
// most maxPer keys in at most maxSlots slots (a power of two).
func shardBounds(maxKeys int) (maxPer, maxSlots int) {
	maxPer = max(1, (maxKeys+numShards-1)/numShards)
	return maxPer, max(minSlots, 1<<bits.Len(uint(maxPer*maxLoadDen/maxLoadNum)))
}

// hash maps a key to its 64-bit fingerprint (never 0) and shard.
func (t *table[C, P]) hash(key string) (fp uint64, sh int) {
	h := maphash.String(t.seed, key)
	return h | 1, int(h >> (64 - shardBits))
}

// home is the first slot to probe for fp in a shard of n slots.
func home(fp uint64, n int) int { return int(fp>>1) & (n - 1) }

// lookup returns the slot index of fp's key, inserting a fresh key when it is
// absent: into the first dead slot on its probe path, else an empty slot,
// rebuilding the shard when it is full. If the shard is full of limited keys,
// which are never evicted, it returns overflowed. Call with sh.mu held.
func (t *table[C, P]) lookup(sh *shard[C], fp uint64, now int64) int {
	for rebuilt := false; ; rebuilt = true {
		n := len(sh.slots)
		if n == 0 {
			sh.slots = make([]slot[C], minSlots)
			n = minSlots
		}
		mask := n - 1
		dead := -1
		i := home(fp, n)
		for {
			s := &sh.slots[i]
			if s.fp == fp {
				return i
			}
			if s.fp == 0 {
				break
			}
			if dead < 0 && P(&s.c).resetAfter(&t.params, now) == 0 {
				dead = i
			}
			i = (i + 1) & mask
		}
		if dead >= 0 { // implicit expiry: reuse the dead slot, no timer needed
			s := &sh.slots[dead]
			s.fp = fp
			P(&s.c).fresh(&t.params, now)
			return dead
		}
		if sh.count < min(n*maxLoadNum/maxLoadDen, t.maxPer) {
			s := &sh.slots[i]
			s.fp = fp
			P(&s.c).fresh(&t.params, now)
			sh.count++
			return i
		}
		if (sh.full != 0 && now < sh.full) || (rebuilt && sh.count >= t.maxPer) {
			if rebuilt {
				sh.full = now + fullRetry
			}
			return overflowed // every key left is limited: none may go
		}
		t.rehash(sh, now, false)
	}
}

// rehash rebuilds the shard. While the shard may still grow it keeps dead
// keys, so a key that comes back after a pause finds its slot; at its size
// bound, or when sweeping, it drops them (implicit expiry). When the live keys
// alone reach the shard's bound it first evicts a batch of them (see
// evictBatch), so that a flood of new keys pays for one rebuild per batch,
// not per key. Only a sweep shrinks the array.
func (t *table[C, P]) rehash(sh *shard[C], now int64, sweep bool) {
	type entry struct {
		i       int
		reset   int64
		limited bool
	}
	dropDead := sweep || len(sh.slots) >= t.maxSlots
	keep := make([]entry, 0, sh.count)
	for i := range sh.slots {
		s := &sh.slots[i]
		if s.fp == 0 {
			continue
		}
		if r := P(&s.c).resetAfter(&t.params, now); r > 0 || !dropDead {
			keep = append(keep, entry{i, r, r > 0 && P(&s.c).limited(&t.params, now)})
		}
	}
	drop, size := bound(keep, func(a, b entry) int { return cmp.Compare(a.reset, b.reset) },
		func(e entry) bool { return e.limited }, t.maxPer, t.maxSlots, len(sh.slots), sweep, &t.evictions)
	old := sh.slots
	sh.slots = make([]slot[C], size)
	sh.count = 0
	mask := size - 1
	for _, e := range keep[drop:] {
		s := &old[e.i]
		j := home(s.fp, size)
		for sh.slots[j].fp != 0 {
			j = (j + 1) & mask
		}
		sh.slots[j] = *s
		sh.count++
	}
}

// fullRetry is how long a shard found full of limited keys sends new keys
// to the overflow state before it rebuilds to look again: a flood of new
// keys then costs one rebuild per fullRetry, not one per key.
const fullRetry = int64(50 * time.Millisecond)

// evictBatch is how many live keys a full shard evicts at once: 1/16 of its
// bound, at least one.
func evictBatch(maxPer int) int { return max(1, maxPer/16) }

// bound applies a shard's key bound to the keys a rebuild keeps. If they
// reach the shard's share (maxPer), it sorts them closest to idle first
// (closer) and evicts a batch from the front: their loss changes the fewest
// answers. A limited key (one that would refuse a take of one unit now) is
// never evicted, whatever its place: evicting it would give its client a
// full, fresh key, so a flood of new keys could reset a key over its limit.
// If no key but limited ones is left, the shard evicts nothing and stays
// full, and lookup sends new keys to the table's overflow state. bound
// returns how many to drop from the front of keep and the new slot count
// (never smaller than oldLen unless sweeping).
func bound[E any](keep []E, closer func(a, b E) int, limited func(E) bool, maxPer, maxSlots, oldLen int, sweep bool, evictions *atomic.Uint64) (drop, size int) {
	if len(keep) >= maxPer {
		slices.SortFunc(keep, func(a, b E) int {
			if la, lb := limited(a), limited(b); la != lb {
				if la {
					return 1 // limited keys last, out of eviction's reach
				}
				return -1
			}
			return closer(a, b)
		})
		evictable := 0
		for evictable < len(keep) && !limited(keep[evictable]) {
			evictable++
		}
		drop = min(len(keep)-maxPer+evictBatch(maxPer), evictable)
		evictions.Add(uint64(drop))
	}
	size = sizeFor(len(keep)-drop, maxSlots)
	if !sweep {
		size = max(size, oldLen)
	}
	return drop, size
}

// sizeFor returns the slot count for a shard about to hold keys: the smallest
// power of two that leaves it at most half full, up to maxSlots. A shard that
// grows at 3/4 full therefore doubles.
func sizeFor(keys, maxSlots int) int {
	size := minSlots
	for size < maxSlots && keys+1 > size/2 {
		size *= 2
	}
	return size
}

// remove empties slot i and shifts the rest of its probe cluster back, so no
// tombstones are needed.
func (t *table[C, P]) remove(sh *shard[C], i int) {
	n := len(sh.slots)
	mask := n - 1
	sh.slots[i] = slot[C]{}
	sh.count--
	for j := (i + 1) & mask; sh.slots[j].fp != 0; j = (j + 1) & mask {
		k := home(sh.slots[j].fp, n)
		// Slot j may move back to i unless its home lies cyclically in (i, j].
		if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		sh.slots[i] = sh.slots[j]
		sh.slots[j] = slot[C]{}
		i = j
	}
}

// find returns fp's slot index or -1. Call with sh.mu held.
func (sh *shard[C]) find(fp uint64) int {
	n := len(sh.slots)
	if n == 0 {
		return -1
	}
	mask := n - 1
	for i := home(fp, n); sh.slots[i].fp != 0; i = (i + 1) & mask {
		if sh.slots[i].fp == fp {
			return i
		}
	}
	return -1
}

// The methods below implement anyTable for the store.

func (t *table[C, P]) meta() *tableMeta { return &t.m }

func (t *table[C, P]) locate(key string) (uint64, int) { return t.hash(key) }

func (t *table[C, P]) lockShard(sh int)   { t.shards[sh].mu.Lock() }
func (t *table[C, P]) unlockShard(sh int) { t.shards[sh].mu.Unlock() }

func (t *table[C, P]) takeLocked(sh int, fp uint64, now, cost int64, dry bool) (algo.Result, saved) {
	c, over := t.cell(&t.shards[sh], fp, now)
	if over {
		t.overflowMu.Lock()
		defer t.overflowMu.Unlock()
	}
	units, o := opOf(cost, dry)
	return t.apply(c, now, units, o)
}

// apply performs o with units on c, undoing a take at once for a dry run.
// It returns the result and the state before.
func (t *table[C, P]) apply(c P, now, units int64, o op) (algo.Result, saved) {
	sv := c.save()
	switch o {
	case opRefund:
		c.refund(&t.params, now, units)
		r := c.take(&t.params, now, 0)
		r.Applied()
		return r, sv
	case opCharge:
		c.charge(&t.params, now, units)
		r := c.take(&t.params, now, 0)
		r.Applied()
		return r, sv
	}
	r := c.take(&t.params, now, units)
	if o == opDry && r.Allowed && units > 0 {
		c.restore(sv, units)
	}
	return r, sv
}

// undoLocked undoes a take of the same multi-key call. A take that went to
// the overflow cell is not undone: other keys may have changed that cell
// since, and keeping the units errs on the strict side.
func (t *table[C, P]) undoLocked(sh int, fp uint64, sv saved, cost int64) {
	s := &t.shards[sh]
	if i := s.find(fp); i >= 0 { // an eviction in the same take may have removed it
		P(&s.slots[i].c).restore(sv, cost)
	}
}

func (t *table[C, P]) take(key string, now, cost int64, dry bool) algo.Result {
	units, o := opOf(cost, dry)
	return t.do(key, now, units, o)
}

func (t *table[C, P]) chargeKey(key string, now, units int64) algo.Result {
	return t.do(key, now, units, opCharge)
}

func (t *table[C, P]) do(key string, now, units int64, o op) algo.Result {
	fp, i := t.hash(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c, over := t.cell(sh, fp, now)
	if over {
		t.overflowMu.Lock()
		defer t.overflowMu.Unlock()
	}
	r, _ := t.apply(c, now, units, o)
	return r
}

// with runs fn on key's own cell at now, under its shard's lock; a key
// that would share the overflow cell is not run (over).
func (t *table[C, P]) with(key string, now int64, fn func(P)) (over bool) {
	fp, i := t.hash(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c, over := t.cell(sh, fp, now)
	if !over {
		fn(c)
	}
	return over
}

func (t *table[C, P]) forget(key string) bool {
	fp, i := t.hash(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if j := sh.find(fp); j >= 0 {
		t.remove(sh, j)
		return true
	}
	return false
}

func (t *table[C, P]) stats() (keys int, evictions, overflows uint64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		keys += sh.count
		sh.mu.Unlock()
	}
	return keys, t.evictions.Load(), t.overflows.Load()
}

func (t *table[C, P]) sweep(now int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if len(sh.slots) > 0 {
			t.rehash(sh, now, true)
		}
		sh.mu.Unlock()
	}
}

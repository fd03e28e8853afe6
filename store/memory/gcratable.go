package memory

import (
	"cmp"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// gcraTable is the table for GCRA, whose whole state is one int64: a key's
// take is a compare-and-swap on its TAT, with no lock. The shard mutex only
// serialises changes to the table's structure (inserts, rebuilds, tombstones)
// and multi-key takes.
//
// Lock-free takes are exact because a slot never changes identity while it
// can be updated: a slot is written with its TAT before its fingerprint is
// published, is updated only by compare-and-swap while it holds that key,
// and ends frozen (TAT = frozen) for good, as a tombstone or when its shard
// is rebuilt into a new array. A reader that matched a slot's fingerprint
// therefore either updates that key's TAT or sees frozen and moves on; a
// late compare-and-swap can never land on another key's state.
//
// A multi-key take sets its shards' busy flag under their locks; lock-free
// takes read busy before and after reading a TAT and fall back to the lock
// when it is set, so they never decide on units a multi-key take holds
// tentatively (and may give back).
type gcraTable struct {
	m         tableMeta
	params    algo.Params
	seed      maphash.Seed
	maxPer    int
	maxSlots  int
	evictions atomic.Uint64
	shards    [numShards]gcraShard
}

// frozen marks a slot that no longer takes updates. Real TATs are >= 0.
const frozen = math.MinInt64

type gcraSlot struct {
	fp  atomic.Uint64
	tat atomic.Int64
}

type gcraShard struct {
	mu    sync.Mutex
	busy  atomic.Int32               // a multi-key take holds the lock
	slots atomic.Pointer[[]gcraSlot] // replaced whole on rebuild
	count int                        // occupied slots, tombstones included; under mu
	_     [64 - 8 - 4 - 4 - 8 - 8]byte
}

func newGCRATable(id uint64, rule string, l sluice.Limit, p algo.Params, seed maphash.Seed, maxKeys int) *gcraTable {
	t := &gcraTable{m: tableMeta{id: id, rule: rule, limit: l}, params: p, seed: seed}
	t.maxPer, t.maxSlots = shardBounds(maxKeys)
	return t
}

func (t *gcraTable) meta() *tableMeta { return &t.m }

func (t *gcraTable) locate(key string) (uint64, int) {
	h := maphash.String(t.seed, key)
	return h | 1, int(h >> (64 - shardBits))
}

// take decides a take on key: lock-free when the key is present and no
// multi-key take holds its shard, under the shard lock otherwise.
func (t *gcraTable) take(key string, now, cost int64) (r algo.Result) {
	t.takeInto(key, now, cost, &r)
	return r
}

// takeInto is take writing its result through r, for callers that hold the
// concrete table: a Result returned by value costs more than the decision.
func (t *gcraTable) takeInto(key string, now, cost int64, r *algo.Result) {
	fp, i := t.locate(key)
	sh := &t.shards[i]
	if t.takeFast(sh, fp, now, cost, r) {
		return
	}
	sh.mu.Lock()
	t.lockedInto(i, fp, now, cost, r)
	sh.mu.Unlock()
}

// takeFast decides a take without the lock, if it can.
func (t *gcraTable) takeFast(sh *gcraShard, fp uint64, now, cost int64, r *algo.Result) bool {
	p := sh.slots.Load()
	if p == nil {
		return false
	}
	slots := *p
	mask := len(slots) - 1
	for i, n := home(fp, len(slots)), 0; n < len(slots); i, n = (i+1)&mask, n+1 {
		s := &slots[i]
		f := s.fp.Load()
		if f == 0 {
			return false // absent: insert under the lock
		}
		if f != fp {
			continue
		}
		for {
			if sh.busy.Load() != 0 {
				return false
			}
			old := s.tat.Load()
			if old == frozen {
				break // a tombstone, or a rebuild in progress: probe on
			}
			if sh.busy.Load() != 0 {
				return false
			}
			next := algo.GCRA{TAT: old}.Take(&t.params, now, cost, r)
			if next.TAT == old || s.tat.CompareAndSwap(old, next.TAT) {
				return true
			}
		}
	}
	return false
}

// takeLocked decides a take with the shard lock held, inserting the key if
// absent. Lock-free takes may still run on the shard (unless busy is set), so
// writes are compare-and-swap.
func (t *gcraTable) takeLocked(i int, fp uint64, now, cost int64) (r algo.Result, sv saved) {
	sv = t.lockedInto(i, fp, now, cost, &r)
	return r, sv
}

func (t *gcraTable) lockedInto(i int, fp uint64, now, cost int64, r *algo.Result) saved {
	sh := &t.shards[i]
	s := t.lookup(sh, fp, now)
	for {
		old := s.tat.Load()
		next := algo.GCRA{TAT: old}.Take(&t.params, now, cost, r)
		if next.TAT == old || s.tat.CompareAndSwap(old, next.TAT) {
			return saved{old}
		}
	}
}

// lookup returns fp's live slot, inserting a fresh one if there is none.
// Call with sh.mu held.
func (t *gcraTable) lookup(sh *gcraShard, fp uint64, now int64) *gcraSlot {
	for {
		p := sh.slots.Load()
		if p == nil {
			fresh := make([]gcraSlot, minSlots)
			sh.slots.Store(&fresh)
			p = &fresh
		}
		slots := *p
		mask := len(slots) - 1
		i := home(fp, len(slots))
		for ; ; i = (i + 1) & mask {
			s := &slots[i]
			f := s.fp.Load()
			if f == 0 {
				break
			}
			if f == fp && s.tat.Load() != frozen {
				return s
			}
		}
		if sh.count < min(len(slots)*maxLoadNum/maxLoadDen, t.maxPer) {
			s := &slots[i]
			s.tat.Store(0) // a fresh key; published by the fingerprint
			s.fp.Store(fp)
			sh.count++
			return s
		}
		t.rebuild(sh, now, false)
	}
}

// rebuild freezes every slot of the shard and copies its keys into a new
// array, dropping tombstones. While the shard may still grow it keeps dead
// keys (TAT <= now) too, so a key that comes back after a pause is found
// without the lock; at its size bound, or when sweeping, it drops them
// (implicit expiry), and if the live keys alone reach the key bound it evicts
// a batch of those closest to idle. A sweep may also shrink the array.
func (t *gcraTable) rebuild(sh *gcraShard, now int64, sweep bool) {
	type entry struct {
		fp  uint64
		tat int64
	}
	old := *sh.slots.Load()
	dropDead := sweep || len(old) >= t.maxSlots
	keep := make([]entry, 0, sh.count)
	for i := range old {
		s := &old[i]
		if s.fp.Load() == 0 {
			continue
		}
		if v := s.tat.Swap(frozen); v != frozen && (v > now || !dropDead) {
			keep = append(keep, entry{s.fp.Load(), v})
		}
	}
	drop := 0
	if len(keep) >= t.maxPer {
		drop = len(keep) - t.maxPer + evictBatch(t.maxPer)
		slices.SortFunc(keep, func(a, b entry) int { return cmp.Compare(a.tat, b.tat) })
		t.evictions.Add(uint64(drop))
	}
	size := sizeFor(len(keep)-drop, t.maxSlots)
	if !sweep {
		size = max(size, len(old))
	}
	slots := make([]gcraSlot, size)
	mask := size - 1
	for _, e := range keep[drop:] {
		j := home(e.fp, size)
		for slots[j].fp.Load() != 0 {
			j = (j + 1) & mask
		}
		slots[j].tat.Store(e.tat)
		slots[j].fp.Store(e.fp)
	}
	sh.count = len(keep) - drop
	sh.slots.Store(&slots)
}

// sweep drops every dead key and shrinks the shards to fit what is left,
// giving memory back. Answers are the same with or without it.
func (t *gcraTable) sweep(now int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if sh.slots.Load() != nil {
			t.rebuild(sh, now, true)
		}
		sh.mu.Unlock()
	}
}

func (t *gcraTable) lockShard(i int) {
	t.shards[i].mu.Lock()
	t.shards[i].busy.Store(1)
}

func (t *gcraTable) unlockShard(i int) {
	t.shards[i].busy.Store(0)
	t.shards[i].mu.Unlock()
}

// With busy set, no lock-free take can change a slot of the shard, so an
// undo restores the saved TAT exactly.
func (t *gcraTable) undoLocked(i int, fp uint64, sv saved, _ int64) {
	if s := t.find(&t.shards[i], fp); s != nil {
		s.tat.Store(sv[0])
	}
}

// find returns fp's live slot or nil. Call with sh.mu held.
func (t *gcraTable) find(sh *gcraShard, fp uint64) *gcraSlot {
	p := sh.slots.Load()
	if p == nil {
		return nil
	}
	slots := *p
	mask := len(slots) - 1
	for i := home(fp, len(slots)); slots[i].fp.Load() != 0; i = (i + 1) & mask {
		if slots[i].fp.Load() == fp && slots[i].tat.Load() != frozen {
			return &slots[i]
		}
	}
	return nil
}

func (t *gcraTable) forget(key string) bool {
	fp, i := t.locate(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := t.find(sh, fp); s != nil {
		s.tat.Store(frozen) // a tombstone until the next rebuild
		return true
	}
	return false
}

func (t *gcraTable) stats() (keys int, evictions uint64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		keys += sh.count
		sh.mu.Unlock()
	}
	return keys, t.evictions.Load()
}

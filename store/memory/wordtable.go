package memory

import (
	"cmp"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// wordTable is the table for the algorithms whose whole state is one int64
// word: GCRA (its TAT), the leaky queue (its next departure slot), and the
// token bucket and leaky meter, packed as the instant their bucket was (or
// would have been) empty (see packBucket). A key's take is a compare-and-swap
// on its word, with no lock. The shard mutex only serialises changes to the
// table's structure (inserts, rebuilds, tombstones) and multi-key takes.
//
// Lock-free takes are exact because a slot never changes identity while it
// can be updated: a slot is written with its word before its fingerprint is
// published, is updated only by compare-and-swap while it holds that key,
// and ends frozen (word = frozen) for good, as a tombstone or when its shard
// is rebuilt into a new array. A reader that matched a slot's fingerprint
// therefore either updates that key's word or sees frozen and moves on; a
// late compare-and-swap can never land on another key's state.
//
// A multi-key take sets its shards' busy flag under their locks; lock-free
// takes read busy before and after reading a word and fall back to the lock
// when it is set, so they never decide on units a multi-key take holds
// tentatively (and may give back).
//
// In every one of these encodings a larger word means a fuller (less idle)
// key, and the key is idle once word + idleShift <= now.
type wordTable struct {
	m         tableMeta
	params    algo.Params
	idleShift int64 // the key is idle once word + idleShift <= now
	seed      maphash.Seed
	maxPer    int
	maxSlots  int
	evictions atomic.Uint64
	overflows atomic.Uint64 // takes answered from the overflow word
	locked    atomic.Uint64 // takes that went to the locked path
	shards    [numShards]wordShard

	// overflow is the shared, strict state of the keys that found their
	// shard full of limited keys (see bound); like every slot, it is
	// updated by compare-and-swap only.
	overflow wordSlot
}

// frozen marks a slot that no longer takes updates; fresh is the word of a
// new key, idle in every encoding. step never returns either.
const (
	frozen = math.MinInt64
	fresh  = math.MinInt64 + 1
)

type wordSlot struct {
	fp   atomic.Uint64
	word atomic.Int64 // the state word
}

type wordShard struct {
	mu    sync.Mutex
	busy  atomic.Int32               // a multi-key take holds the lock
	slots atomic.Pointer[[]wordSlot] // replaced whole on rebuild
	count int                        // occupied slots, tombstones included; under mu
	full  int64                      // until then, the shard is full of limited keys; under mu
	_     [64 - 8 - 4 - 4 - 8 - 8 - 8]byte
}

func newWordTable(id uint64, rule string, l sluice.Limit, p algo.Params, seed maphash.Seed, maxKeys int) *wordTable {
	t := &wordTable{m: tableMeta{id: id, rule: rule, limit: l}, params: p, seed: seed}
	t.maxPer, t.maxSlots = shardBounds(maxKeys)
	if l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyMeter {
		t.idleShift = p.D
	}
	t.overflow.word.Store(fresh)
	t.overflow.fp.Store(1)
	return t
}

// apply performs o on the state word v at now, writing the result to r, and
// returns the next word and whether it must be written.
func (t *wordTable) apply(v, now, units int64, o op, r *algo.Result) (int64, bool) {
	if o == opRefund || o == opCharge {
		next := t.adjust(v, now, units, o == opCharge)
		t.step(next, now, 0, r)
		r.Applied()
		return next, next != v
	}
	next := t.step(v, now, units, r)
	return next, o == opTake && r.Allowed && units > 0
}

// adjust gives units back to the state word v at now, or with charge takes
// them whatever the limit says (algo's Charge): a GCRA TAT or a queue's next
// departure moves on, a packed bucket's empty instant moves past now (a
// bucket in debt).
func (t *wordTable) adjust(v, now, units int64, charge bool) int64 {
	p := &t.params
	switch p.Algorithm {
	case sluice.GCRA:
		g := algo.GCRA{TAT: v}
		if charge {
			return max(g.Charge(p, now, units).TAT, fresh)
		}
		return max(g.Refund(p, now, units).TAT, fresh)
	case sluice.LeakyQueue:
		q := algo.LeakyQueue{Next: v}
		if charge {
			return max(q.Charge(p, now, units).Next, fresh)
		}
		return max(q.Refund(p, now, units).Next, fresh)
	default: // the packed buckets: tokens put back or taken out
		tb := algo.TokenBucket{Tokens: bucketLevel(p, v, now), Last: now}
		if charge {
			tb = tb.Charge(p, now, units)
		} else {
			tb = tb.Refund(p, now, units)
		}
		return packBucket(tb.Last, tb.Tokens)
	}
}

func (t *wordTable) chargeKey(key string, now, units int64) (r algo.Result) {
	t.takeInto(key, now, units, opCharge, &r)
	return r
}

// step decides a take on the state word v at now, writing the result to r,
// and returns the next word.
func (t *wordTable) step(v, now, cost int64, r *algo.Result) int64 {
	p := &t.params
	switch p.Algorithm {
	case sluice.GCRA:
		return max(algo.GCRA{TAT: v}.Take(p, now, cost, r).TAT, fresh)
	case sluice.LeakyQueue:
		return max(algo.LeakyQueue{Next: v}.Take(p, now, cost, r).Next, fresh)
	case sluice.TokenBucket:
		tb := algo.TokenBucket{Tokens: bucketLevel(p, v, now), Last: now}.Take(p, now, cost, r)
		return packBucket(tb.Last, tb.Tokens)
	default: // sluice.LeakyMeter
		m := algo.LeakyMeter{Level: p.D - bucketLevel(p, v, now), Last: now}.Take(p, now, cost, r)
		return packBucket(m.Last, p.D-m.Level)
	}
}

// A token bucket's two words (tokens, last) pack into one: e = last - tokens,
// the instant the bucket was empty, tokens being counted in nanoseconds of
// refill. At any later now the bucket holds min(D, now - e) tokens, exactly
// what refilling (tokens, last) to now gives, so with a clock that never
// steps back the packed bucket decides exactly as algo.TokenBucket (the store
// conformance suite checks it). A clock that steps back by d makes a packed
// bucket look d emptier, like GCRA, where the two-word form counts no time.
// The leaky meter packs the same way, its level being D - tokens. A bucket
// in debt (a charge beyond empty, see algo's Charge) has e after now and
// holds now - e < 0 tokens: the debt is paid off when now reaches e.
//
// A debt beyond the int64 range packs to the largest word (saturated); an
// empty instant before the first is fresh.
func packBucket(last, tokens int64) int64 {
	return max(algo.SubSat(last, tokens), fresh)
}

// maxDebt bounds the debt bucketLevel reports, so that D minus it (a leaky
// meter's level) stays in range.
const maxDebt = math.MaxInt64 / 2

// bucketLevel returns the tokens a packed bucket holds at now: below 0 in
// debt, at most maxDebt. now - e is saturated: past the int64 range above,
// the bucket is long full; below, the debt is beyond any bound.
func bucketLevel(p *algo.Params, e, now int64) int64 {
	return min(max(algo.SubSat(now, e), -maxDebt), p.D)
}

func (t *wordTable) meta() *tableMeta { return &t.m }

func (t *wordTable) locate(key string) (uint64, int) {
	h := maphash.String(t.seed, key)
	return h | 1, int(h >> (64 - shardBits))
}

// take decides a take on key: lock-free when the key is present and no
// multi-key take holds its shard, under the shard lock otherwise.
func (t *wordTable) take(key string, now, cost int64, dry bool) (r algo.Result) {
	units, o := opOf(cost, dry)
	t.takeInto(key, now, units, o, &r)
	return r
}

// takeInto is take writing its result through r, for callers that hold the
// concrete table: a Result returned by value costs more than the decision.
func (t *wordTable) takeInto(key string, now, units int64, o op, r *algo.Result) {
	fp, i := t.locate(key)
	sh := &t.shards[i]
	if t.takeFast(sh, fp, now, units, o, r) {
		return
	}
	t.locked.Add(1) // the slow path only: for tests and profiles
	sh.mu.Lock()
	t.lockedInto(i, fp, now, units, o, r)
	sh.mu.Unlock()
}

// takeFast decides a take without the lock, if it can.
func (t *wordTable) takeFast(sh *wordShard, fp uint64, now, units int64, o op, r *algo.Result) bool {
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
			old := s.word.Load()
			if old == frozen {
				break // a tombstone, or a rebuild in progress: probe on
			}
			if sh.busy.Load() != 0 {
				return false
			}
			next, write := t.apply(old, now, units, o, r)
			if !write || s.word.CompareAndSwap(old, next) {
				return true
			}
		}
	}
	return false
}

// takeLocked decides a take with the shard lock held, inserting the key if
// absent. Lock-free takes may still run on the shard (unless busy is set), so
// writes are compare-and-swap.
func (t *wordTable) takeLocked(i int, fp uint64, now, cost int64, dry bool) (r algo.Result, sv saved) {
	units, o := opOf(cost, dry)
	sv = t.lockedInto(i, fp, now, units, o, &r)
	return r, sv
}

func (t *wordTable) lockedInto(i int, fp uint64, now, units int64, o op, r *algo.Result) saved {
	sh := &t.shards[i]
	s := t.lookup(sh, fp, now)
	for {
		old := s.word.Load()
		next, write := t.apply(old, now, units, o, r)
		if !write || s.word.CompareAndSwap(old, next) {
			return saved{old}
		}
	}
}

// lookup returns fp's live slot, inserting a fresh one if there is none. If
// the shard is full of limited keys, which are never evicted, it returns the
// table's overflow slot. Call with sh.mu held.
func (t *wordTable) lookup(sh *wordShard, fp uint64, now int64) *wordSlot {
	for rebuilt := false; ; rebuilt = true {
		p := sh.slots.Load()
		if p == nil {
			fresh := make([]wordSlot, minSlots)
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
			if f == fp && s.word.Load() != frozen {
				return s
			}
		}
		if sh.count < min(len(slots)*maxLoadNum/maxLoadDen, t.maxPer) {
			s := &slots[i]
			s.word.Store(fresh) // published by the fingerprint
			s.fp.Store(fp)
			sh.count++
			return s
		}
		if (sh.full != 0 && now < sh.full) || (rebuilt && sh.count >= t.maxPer) {
			if rebuilt {
				sh.full = now + fullRetry
			}
			t.overflows.Add(1)
			return &t.overflow // every key left is limited: none may go
		}
		t.rebuild(sh, now, false)
	}
}

// rebuild freezes every slot of the shard and copies its keys into a new
// array, dropping tombstones. While the shard may still grow it keeps dead
// keys too, so a key that comes back after a pause is found
// without the lock; at its size bound, or when sweeping, it drops them
// (implicit expiry), and if the live keys alone reach the key bound it evicts
// a batch of those closest to idle. A sweep may also shrink the array.
func (t *wordTable) rebuild(sh *wordShard, now int64, sweep bool) {
	type entry struct {
		fp      uint64
		word    int64
		limited bool
	}
	old := *sh.slots.Load()
	dropDead := sweep || len(old) >= t.maxSlots
	keep := make([]entry, 0, sh.count)
	for i := range old {
		s := &old[i]
		if s.fp.Load() == 0 {
			continue
		}
		if v := s.word.Swap(frozen); v != frozen && (!t.idle(v, now) || !dropDead) {
			keep = append(keep, entry{s.fp.Load(), v, t.limited(v, now)})
		}
	}
	// In every encoding the smallest words are the keys closest to idle.
	drop, size := bound(keep, func(a, b entry) int { return cmp.Compare(a.word, b.word) },
		func(e entry) bool { return e.limited }, t.maxPer, t.maxSlots, len(old), sweep, &t.evictions)
	slots := make([]wordSlot, size)
	mask := size - 1
	for _, e := range keep[drop:] {
		j := home(e.fp, size)
		for slots[j].fp.Load() != 0 {
			j = (j + 1) & mask
		}
		slots[j].word.Store(e.word)
		slots[j].fp.Store(e.fp)
	}
	sh.count = len(keep) - drop
	sh.slots.Store(&slots)
}

// limited reports whether the key with word v would refuse a take of one
// unit at now.
func (t *wordTable) limited(v, now int64) bool {
	var r algo.Result
	t.step(v, now, 0, &r)
	return r.Remaining == 0
}

// idle reports whether the key with word v is back to its idle state at now.
func (t *wordTable) idle(v, now int64) bool {
	d := now - v // negative only if it overflowed: then v is long past
	return v <= now && (d < 0 || d >= t.idleShift)
}

// sweep drops every dead key and shrinks the shards to fit what is left,
// giving memory back. Answers are the same with or without it while the
// clock moves forward (Store.Sweep).
func (t *wordTable) sweep(now int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if sh.slots.Load() != nil {
			t.rebuild(sh, now, true)
		}
		sh.mu.Unlock()
	}
}

func (t *wordTable) lockShard(i int) {
	t.shards[i].mu.Lock()
	t.shards[i].busy.Store(1)
}

func (t *wordTable) unlockShard(i int) {
	t.shards[i].busy.Store(0)
	t.shards[i].mu.Unlock()
}

// With busy set, no lock-free take can change a slot of the shard, so an
// undo restores the saved TAT exactly.
func (t *wordTable) undoLocked(i int, fp uint64, sv saved, _ int64) {
	if s := t.find(&t.shards[i], fp); s != nil {
		s.word.Store(sv[0])
	}
}

// find returns fp's live slot or nil. Call with sh.mu held.
func (t *wordTable) find(sh *wordShard, fp uint64) *wordSlot {
	p := sh.slots.Load()
	if p == nil {
		return nil
	}
	slots := *p
	mask := len(slots) - 1
	for i := home(fp, len(slots)); slots[i].fp.Load() != 0; i = (i + 1) & mask {
		if slots[i].fp.Load() == fp && slots[i].word.Load() != frozen {
			return &slots[i]
		}
	}
	return nil
}

func (t *wordTable) forget(key string) bool {
	fp, i := t.locate(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := t.find(sh, fp); s != nil {
		s.word.Store(frozen) // a tombstone until the next rebuild
		return true
	}
	return false
}

func (t *wordTable) stats() (keys int, evictions, overflows uint64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		keys += sh.count
		sh.mu.Unlock()
	}
	return keys, t.evictions.Load(), t.overflows.Load()
}

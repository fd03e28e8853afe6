package memory

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// A rule's keys live in a table per limit, so a key whose limit changes
// would start fresh in the new limit's table. A take that names the limits
// the key may have had (sluice.Take.Was) moves the key's state instead:
// when the key holds no live state under the take's limit (or only the copy
// it left there when it moved away), the first table of Was that holds it
// gives its state, converted (algo's Carry), under the locks of the key's
// shard in every table involved, taken in the store's one order (table id,
// then shard): the move is one step.
//
// The table it moved from keeps its state for movedGrace, marked as moved
// (tableMeta.moved), for the takes that have not seen the change yet (a
// request matched under the old rules a moment before): they count from
// what the key had spent, never afresh. A take carrying back into that
// table within the grace (the change undone) treats the copy as absent.

// carry moves tk's key to tk.Limit's table from the first table of tk.Was
// that holds it live, converted. A key already live under tk.Limit, or held
// nowhere, is left as it is.
func (s *Store) carry(tk *sluice.Take) error {
	if tk.Limit.Portion > 0 {
		return nil // a region's part is its agent's to set
	}
	t, err := s.table(tk.Rule, tk.Limit)
	if err != nil {
		return err
	}
	fp, sh := t.locate(tk.Key)
	now := s.clock.Now()
	if t.live(sh, fp, now) && !t.meta().moved.has(fp, now) {
		return nil // the common case: the key has been carried, or never moved
	}
	entries := (*s.tables.Load())[tk.Rule]
	var pbuf [maxLocks]pending
	ps := append(pbuf[:0], pending{t: t, shard: sh, fp: fp})
	for _, w := range tk.Was {
		if w.Algorithm != tk.Limit.Algorithm || w == tk.Limit || w.Portion > 0 {
			continue
		}
		if u := find(entries, w); u != nil {
			ps = append(ps, pending{t: u, shard: sh, fp: fp})
		}
	}
	if len(ps) == 1 {
		return nil // no table of Was: nothing was counted elsewhere
	}
	var lbuf [maxLocks]lockRef
	locks := lockOrder(ps, lbuf[:0])
	for _, l := range locks {
		l.t.lockShard(l.shard)
	}
	if t.meta().moved.has(fp, now) || !t.liveLocked(sh, fp, now) {
		for _, p := range ps[1:] {
			// A copy left behind is no state of the key's once the state it
			// left for is found (carryLocked writes over it); until then it
			// is all the take knows.
			if !p.t.meta().moved.has(fp, now) && t.carryLocked(p.t, sh, fp, now) {
				t.meta().moved.forget(fp)
				if !p.t.meta().moved.add(fp, now+movedGrace) {
					p.t.forgetLocked(sh, fp) // no room to remember it moved: it moves whole
				}
				break
			}
		}
	}
	for i := len(locks) - 1; i >= 0; i-- {
		locks[i].t.unlockShard(locks[i].shard)
	}
	return nil
}

// carryWord converts a word table's state word v kept under from to to.
func carryWord(from, to *algo.Params, v, now int64) int64 {
	switch to.Algorithm {
	case sluice.GCRA:
		return max(algo.GCRA{TAT: v}.Carry(from, to, now).TAT, fresh)
	case sluice.LeakyQueue:
		return max(algo.LeakyQueue{Next: v}.Carry(from, to, now).Next, fresh)
	case sluice.TokenBucket:
		tb := algo.TokenBucket{Tokens: bucketLevel(from, v, now), Last: now}.Carry(from, to, now)
		return packBucket(tb.Last, tb.Tokens)
	default: // sluice.LeakyMeter
		m := algo.LeakyMeter{Level: from.D - bucketLevel(from, v, now), Last: now}.Carry(from, to, now)
		return packBucket(m.Last, to.D-m.Level)
	}
}

// live reports, without the lock, whether fp holds state under t that is
// not back to idle.
func (t *wordTable) live(i int, fp uint64, now int64) bool {
	p := t.shards[i].slots.Load()
	if p == nil {
		return false
	}
	slots := *p
	mask := len(slots) - 1
	for j, n := home(fp, len(slots)), 0; n < len(slots); j, n = (j+1)&mask, n+1 {
		f := slots[j].fp.Load()
		if f == 0 {
			return false
		}
		if v := slots[j].word.Load(); f == fp && v != frozen {
			return !t.idle(v, now)
		}
	}
	return false
}

func (t *wordTable) liveLocked(i int, fp uint64, now int64) bool {
	s := t.find(&t.shards[i], fp)
	return s != nil && !t.idle(s.word.Load(), now)
}

// carryLocked copies fp's state from table from (a word table of the same
// algorithm) to t, converted, and reports whether from held the key; a
// state back to idle leaves the key fresh in t. Call with fp's shard locked
// in both (their busy flags keep lock-free takes off the two slots).
func (t *wordTable) carryLocked(from anyTable, i int, fp uint64, now int64) bool {
	src, ok := from.(*wordTable)
	if !ok {
		return false
	}
	s := src.find(&src.shards[i], fp)
	if s == nil {
		return false
	}
	v := s.word.Load()
	if src.idle(v, now) {
		t.forgetLocked(i, fp) // the key's state is back to idle: it is fresh here too
		return true
	}
	if d := t.lookup(&t.shards[i], fp, now); d != &t.overflow {
		d.word.Store(carryWord(&src.params, &t.params, v, now))
	}
	return true
}

func (t *table[C, P]) live(i int, fp uint64, now int64) bool {
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return t.liveLocked(i, fp, now)
}

func (t *table[C, P]) liveLocked(i int, fp uint64, now int64) bool {
	sh := &t.shards[i]
	j := sh.find(fp)
	return j >= 0 && P(&sh.slots[j].c).resetAfter(&t.params, now) > 0
}

// carryLocked copies fp's cell from table from (of the same cell type) to
// t, converted, as the word table's does. Call with fp's shard locked in
// both.
func (t *table[C, P]) carryLocked(from anyTable, i int, fp uint64, now int64) bool {
	src, ok := from.(*table[C, P])
	if !ok {
		return false
	}
	ssh := &src.shards[i]
	j := ssh.find(fp)
	if j < 0 {
		return false
	}
	if P(&ssh.slots[j].c).resetAfter(&src.params, now) == 0 {
		t.forgetLocked(i, fp) // the key's state is back to idle: it is fresh here too
		return true
	}
	c := ssh.slots[j].c // the cell's carry copies a sliding log's buffer
	dsh := &t.shards[i]
	if k := t.lookup(dsh, fp, now); k != overflowed {
		dsh.slots[k].c = c
		P(&dsh.slots[k].c).carry(&src.params, &t.params, now)
	}
	return true
}

// forgetLocked drops fp's state from the table; call with its shard locked.
func (t *wordTable) forgetLocked(i int, fp uint64) {
	if s := t.find(&t.shards[i], fp); s != nil {
		s.word.Store(frozen) // a tombstone until the shard's next rebuild
	}
}

func (t *table[C, P]) forgetLocked(i int, fp uint64) {
	if j := t.shards[i].find(fp); j >= 0 {
		t.remove(&t.shards[i], j)
	}
}

// movedGrace is how long a table surely remembers that a key's state moved
// to another limit of its rule: longer than any request takes from its
// match to its take. Past it the mark may give way to newer ones.
const movedGrace = int64(5 * time.Second)

// maxMoved bounds the keys a table remembers as moved; past it, marks whose
// grace has ended are dropped, and if none has, a key moves whole, leaving
// nothing behind.
const maxMoved = 1 << 16

// movedKeys are the keys whose state moved out of a table, by fingerprint,
// each until its grace ends (store time).
type movedKeys struct {
	n  atomic.Int32 // len(m): the common case, none, without the lock
	mu sync.Mutex
	m  map[uint64]int64
}

// has reports whether fp's state in the table is a copy left when it moved:
// stale for a take that knows the key's earlier limits, whatever its age,
// and what a take that does not know them counts from.
func (k *movedKeys) has(fp uint64, _ int64) bool {
	if k.n.Load() == 0 {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.m[fp]
	return ok
}

// add remembers fp as moved until until; false if the table remembers as
// many as it may.
func (k *movedKeys) add(fp uint64, until int64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[uint64]int64{}
	}
	if len(k.m) >= maxMoved {
		for f, u := range k.m {
			if u <= until-movedGrace { // a copy whose grace has ended: drop it with its mark
				delete(k.m, f)
			}
		}
		if len(k.m) >= maxMoved {
			return false
		}
	}
	k.m[fp] = until
	k.n.Store(int32(len(k.m)))
	return true
}

func (k *movedKeys) forget(fp uint64) {
	if k.n.Load() == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, fp)
	k.n.Store(int32(len(k.m)))
}

package memory

import (
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// A rule's keys live in a table per limit, so a key whose limit changes
// would start fresh in the new limit's table. A take that names the limits
// the key may have had (sluice.Take.Was) moves the key's state instead:
// when the key holds no live state under the take's limit, the first table
// of Was that does gives it up, converted (algo's Carry), under the locks of
// the key's shard in every table involved, taken in the store's one order
// (table id, then shard). A key is then live in at most one of its rule's
// tables, and the move is one step: no take, lock-free or not, sees the
// key in neither table or in both.

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
	if t.live(sh, fp, now) {
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
	if !t.liveLocked(sh, fp, now) {
		for _, p := range ps[1:] {
			if t.carryLocked(p.t, sh, fp, now) {
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

// carryLocked moves fp's live state from table from (a word table of the
// same algorithm) to t, converted. Call with fp's shard locked in both
// (their busy flags keep lock-free takes off the two slots).
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
		return false
	}
	s.word.Store(frozen) // a tombstone until the shard's next rebuild
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

// carryLocked moves fp's live cell from table from (of the same cell type)
// to t, converted. Call with fp's shard locked in both.
func (t *table[C, P]) carryLocked(from anyTable, i int, fp uint64, now int64) bool {
	src, ok := from.(*table[C, P])
	if !ok {
		return false
	}
	ssh := &src.shards[i]
	j := ssh.find(fp)
	if j < 0 || P(&ssh.slots[j].c).resetAfter(&src.params, now) == 0 {
		return false
	}
	c := ssh.slots[j].c // the cell moves whole: a sliding log's buffer with it
	src.remove(ssh, j)
	dsh := &t.shards[i]
	if k := t.lookup(dsh, fp, now); k != overflowed {
		dsh.slots[k].c = c
		P(&dsh.slots[k].c).carry(&src.params, &t.params, now)
	}
	return true
}

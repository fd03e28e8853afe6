package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// DefaultMaxKeys is the default bound on the keys one rule may hold: 128 MiB
// of table for a GCRA rule at the bound (2^16 slots of 16 B in each of 128
// shards). Past it, dead keys are reused and then the least useful live keys
// evicted; see [WithMaxKeys].
const DefaultMaxKeys = 1 << 22

// Store is the embedded, in-process store. It implements [sluice.Store] for
// every algorithm and is safe for concurrent use. The zero value is not
// usable: call [New].
type Store struct {
	clock   sluice.Clock
	maxKeys int
	seed    maphash.Seed
	nextID  atomic.Uint64
	holds   *holds
	maxHold int

	mu     sync.Mutex                              // serialises table creation
	tables atomic.Pointer[map[string][]tableEntry] // copy-on-write

	sweepEvery time.Duration
	stop       chan struct{}
	stopped    chan struct{} // closed when the janitor has returned
	stopOnce   sync.Once
}

// Option configures a Store.
type Option func(*Store)

// WithClock makes the store read time from c instead of a [sluice.SystemClock].
// Tests pass a [sluice.ManualClock]; a [sluice.CoarseClock] trades precision
// for speed.
func WithClock(c sluice.Clock) Option { return func(s *Store) { s.clock = c } }

// WithMaxKeys bounds the keys each rule may hold (rounded up to a multiple of
// 128, the number of shards; each shard holds at most its share). When a
// shard reaches its share, it rebuilds: dead keys are dropped, and if the live
// keys alone still fill it, a batch of 1/16 of its share is evicted, the keys
// closest to their idle state first. A key that is limited (would refuse one
// unit now) is never evicted; a shard holding only limited keys sends new keys
// to the rule's strict overflow state. An evicted key returns as a fresh,
// full key, which favours its client; evictions and overflows are counted in
// [Store.Stats].
func WithMaxKeys(n int) Option { return func(s *Store) { s.maxKeys = max(1, n) } }

// WithMaxHolds bounds the reservations open at once (see sluice.Take.Hold).
// Past it, expired reservations are dropped; if the open ones alone fill
// it, a call that would open another is refused (ReasonUnavailable) before
// anything is taken, and counted in [Store.RefusedHolds].
func WithMaxHolds(n int) Option { return func(s *Store) { s.maxHold = max(1, n) } }

// RefusedHolds returns how many calls were refused because the store held
// WithMaxHolds open reservations.
func (s *Store) RefusedHolds() uint64 { return s.holds.refused.Load() }

// OpenHolds returns how many reservations the store records now.
func (s *Store) OpenHolds() int { return s.holds.len() }

// WithSweepEvery starts a janitor that calls [Store.Sweep] every d, to give
// memory back after bursts of keys. It is never needed for correct answers.
// A store with a janitor must be closed with [Store.Close].
func WithSweepEvery(d time.Duration) Option { return func(s *Store) { s.sweepEvery = d } }

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{maxKeys: DefaultMaxKeys, maxHold: DefaultMaxHolds, seed: maphash.MakeSeed()}
	for _, o := range opts {
		o(s)
	}
	s.holds = newHolds(s.maxHold)
	if s.clock == nil {
		s.clock = sluice.NewSystemClock()
	}
	empty := map[string][]tableEntry{}
	s.tables.Store(&empty)
	if s.sweepEvery > 0 {
		s.stop, s.stopped = make(chan struct{}), make(chan struct{})
		go s.janitor()
	}
	return s
}

func (s *Store) janitor() {
	defer close(s.stopped)
	t := time.NewTicker(s.sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.Sweep()
		case <-s.stop:
			return
		}
	}
}

// Close stops the janitor, if any, and returns once it has stopped: no sweep
// runs after Close returns. The store keeps answering.
func (s *Store) Close() error {
	if s.stop != nil {
		s.stopOnce.Do(func() { close(s.stop) })
		<-s.stopped
	}
	return nil
}

// A rule's keys live in a table of their own; a rule whose limit changes gets
// a new table, and its keys start fresh, while unchanged rules keep theirs.
// Tables are found by rule id (a short string, quick to hash), then limit.
type tableEntry struct {
	limit sluice.Limit
	t     anyTable
}

func find(entries []tableEntry, l sluice.Limit) anyTable {
	for i := range entries {
		if entries[i].limit == l {
			return entries[i].t
		}
	}
	return nil
}

type tableMeta struct {
	id    uint64
	rule  string
	limit sluice.Limit
	moved movedKeys // keys whose state moved to another of the rule's limits (carry.go)
}

// anyTable is a table of any cell type.
type anyTable interface {
	meta() *tableMeta
	locate(key string) (fp uint64, shard int)
	lockShard(shard int)
	unlockShard(shard int)
	takeLocked(shard int, fp uint64, now, cost int64, dry bool) (algo.Result, saved)
	undoLocked(shard int, fp uint64, sv saved, cost int64)
	take(key string, now, cost int64, dry bool) algo.Result
	chargeKey(key string, now, units int64) algo.Result
	forget(key string) bool
	// live, liveLocked and carryLocked move a key between a rule's tables
	// (carry.go).
	live(shard int, fp uint64, now int64) bool
	liveLocked(shard int, fp uint64, now int64) bool
	carryLocked(from anyTable, shard int, fp uint64, now int64) bool
	forgetLocked(shard int, fp uint64)
	stats() (keys int, evictions, overflows uint64)
	sweep(now int64)
}

// table returns the table for (rule, l), creating it on first use.
func (s *Store) table(rule string, l sluice.Limit) (anyTable, error) {
	if t := find((*s.tables.Load())[rule], l); t != nil {
		return t, nil
	}
	p, err := algo.NewParams(l)
	if err != nil {
		return nil, fmt.Errorf("memory: rule %q: %w", rule, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.tables.Load()
	if t := find(old[rule], l); t != nil {
		return t, nil
	}
	id := s.nextID.Add(1)
	var t anyTable
	switch l.Algorithm {
	case sluice.TokenBucket:
		if l.Portion > 0 {
			t = newTable[portionCell](id, rule, l, p, s.seed, s.maxKeys)
			break
		}
		t = newWordTable(id, rule, l, p, s.seed, s.maxKeys)
	case sluice.GCRA, sluice.LeakyMeter, sluice.LeakyQueue:
		t = newWordTable(id, rule, l, p, s.seed, s.maxKeys)
	case sluice.FixedWindow:
		t = newTable[fixedWindowCell](id, rule, l, p, s.seed, s.maxKeys)
	case sluice.SlidingLog:
		t = newTable[slidingLogCell](id, rule, l, p, s.seed, s.maxKeys)
	case sluice.SlidingWindow:
		t = newTable[slidingWindowCell](id, rule, l, p, s.seed, s.maxKeys)
	}
	next := maps.Clone(old) // never nil: the first map is made empty
	next[rule] = append(slices.Clip(old[rule]), tableEntry{l, t})
	s.tables.Store(&next)
	return t, nil
}

// ErrNegativeCost is returned by Limiter.Take for a cost below zero: give
// units back with Limiter.Refund.
var ErrNegativeCost = errors.New("memory: cost must be >= 0")

// op is what a take does to a word table's key.
type op uint8

const (
	opTake op = iota
	opDry
	opRefund
	opCharge // take whatever the limit says (a settle beyond its estimate)
)

// opOf maps a take's cost and dry-run flag to units and an op: a negative
// cost gives units back.
func opOf(cost int64, dry bool) (int64, op) {
	switch {
	case cost < 0:
		return -cost, opRefund
	case dry:
		return cost, opDry
	}
	return cost, opTake
}

// maxLocks is how many shard locks a multi-key take keeps on the stack.
const maxLocks = 8

type pending struct {
	t     anyTable
	shard int
	fp    uint64
	r     algo.Result
	sv    saved
}

// Take implements [sluice.Store]: every take is decided in one atomic step
// under the locks of all the shards involved, taken in a fixed order. If any
// take is not allowed, the allowed ones are undone, so none consumes anything;
// dry-run takes are always undone. Each decision then reports its key's state
// as it stands.
func (s *Store) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if len(out) < len(takes) {
		return fmt.Errorf("memory: %d takes but room for %d decisions", len(takes), len(out))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i := range takes {
		if len(takes[i].Was) > 0 {
			if err := s.carry(&takes[i]); err != nil {
				return err
			}
		}
	}
	for i := range takes {
		if takes[i].Hold != "" || takes[i].Charge {
			return s.takeHolding(ctx, takes, out)
		}
	}
	return s.take(ctx, takes, out)
}

// take is Take for calls without reservations.
func (s *Store) take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if len(takes) == 1 && takes[0].Floor <= 0 {
		return s.takeOne(&takes[0], &out[0])
	}
	var pbuf [maxLocks]pending
	ps := pbuf[:0]
	for i := range takes {
		tk := &takes[i] // not a copy: a Take is large, and this is the hot path
		t, err := s.table(tk.Rule, tk.Limit)
		if err != nil {
			return err
		}
		fp, sh := t.locate(tk.Key)
		ps = append(ps, pending{t: t, shard: sh, fp: fp})
	}
	now := s.clock.Now()

	var lbuf [maxLocks]lockRef
	locks := lockOrder(ps, lbuf[:0])
	for _, l := range locks {
		l.t.lockShard(l.shard)
	}
	ok := true
	for i := range ps {
		p := &ps[i]
		if f := takes[i].Floor; f > 0 && takes[i].Cost > 0 {
			// Decide as cost + floor, under the same locks: a lock-free
			// take cannot run on a busy shard in between (wordtable.go).
			p.r, _ = p.t.takeLocked(p.shard, p.fp, now, algo.AddSat(takes[i].Cost, f), true)
			p.r.Remaining = max(p.r.Remaining-f, 0)
			if !p.r.Allowed {
				ok = false
				continue
			}
		}
		p.r, p.sv = p.t.takeLocked(p.shard, p.fp, now, takes[i].Cost, takes[i].DryRun)
		if f := takes[i].Floor; f > 0 && takes[i].Cost > 0 {
			p.r.Remaining = max(p.r.Remaining-f, 0)
		}
		ok = ok && p.r.Allowed
	}
	if !ok { // dry runs were never committed; refunds stand
		for i := len(ps) - 1; i >= 0; i-- {
			if p := &ps[i]; p.r.Allowed && takes[i].Cost > 0 && !takes[i].DryRun {
				p.t.undoLocked(p.shard, p.fp, p.sv, takes[i].Cost)
			}
		}
		for i := range ps { // report the state that stands after the undo
			if p := &ps[i]; p.r.Allowed && takes[i].Cost > 0 && !takes[i].DryRun {
				peek, _ := p.t.takeLocked(p.shard, p.fp, now, 0, false)
				p.r.Remaining, p.r.ResetAfter = max(peek.Remaining-max(takes[i].Floor, 0), 0), peek.ResetAfter
			}
		}
	}
	for i := len(locks) - 1; i >= 0; i-- {
		locks[i].t.unlockShard(locks[i].shard)
	}
	for i := range ps {
		decide(&out[i], ps[i].t.meta(), &ps[i].r)
	}
	return nil
}

// takeOne decides a call of one take with no floor, the call of a request
// that matches one rule: the table's own take, lock-free when it can be,
// with none of the multi-key bookkeeping (the key hashed once, no array
// of pending takes to clear).
func (s *Store) takeOne(tk *sluice.Take, out *sluice.Decision) error {
	t, err := s.table(tk.Rule, tk.Limit)
	if err != nil {
		return err
	}
	r := t.take(tk.Key, s.clock.Now(), tk.Cost, tk.DryRun)
	decide(out, t.meta(), &r)
	return nil
}

type lockRef struct {
	id    uint64
	shard int
	t     anyTable
}

// lockOrder appends the distinct shard mutexes of ps to refs, ordered by
// table id and shard: the global order that keeps concurrent multi-key takes
// free of deadlock.
func lockOrder(ps []pending, refs []lockRef) []lockRef {
	for _, p := range ps {
		r := lockRef{p.t.meta().id, p.shard, p.t}
		i := len(refs)
		for i > 0 && (refs[i-1].id > r.id || refs[i-1].id == r.id && refs[i-1].shard > r.shard) {
			i--
		}
		if i > 0 && refs[i-1].id == r.id && refs[i-1].shard == r.shard {
			continue // already held for an earlier take
		}
		refs = append(refs, lockRef{})
		copy(refs[i+1:], refs[i:])
		refs[i] = r
	}
	return refs
}

// decide fills d from r, field by field: copying whole structs by value costs
// more than the decision itself on the hot path.
func decide(d *sluice.Decision, m *tableMeta, r *algo.Result) {
	d.Allowed = r.Allowed
	d.Reason = r.Reason
	d.Rule = m.rule
	d.Limit = m.limit
	d.Remaining = r.Remaining
	d.RetryAfter = time.Duration(r.RetryAfter)
	d.ResetAfter = time.Duration(r.ResetAfter)
	d.Delay = time.Duration(r.Delay)
}

// Forget removes key's state under rule (for every limit the rule has had),
// so its next take starts fresh: an operator's "unlock this user". It
// reports whether there was any state.
func (s *Store) Forget(rule, key string) bool {
	found := false
	for _, e := range (*s.tables.Load())[rule] {
		if e.t.forget(key) {
			found = true
		}
	}
	return found
}

// DropLimit frees the table of rule under limit l, if there is one: its keys
// start fresh if the limit comes back. The engine calls it for Envoy limit
// overrides that have gone idle (see engine.LimitDropper).
func (s *Store) DropLimit(rule string, l sluice.Limit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.tables.Load()
	if find(old[rule], l) == nil {
		return
	}
	next := maps.Clone(old)
	var kept []tableEntry
	for _, e := range old[rule] {
		if e.limit != l {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		delete(next, rule)
	} else {
		next[rule] = kept
	}
	s.tables.Store(&next)
}

// Sweep drops the state of every dead key (one back to its idle state) and
// shrinks the tables to fit the keys left, giving memory back to the runtime.
// Answers are the same with or without sweeps while the clock moves forward
// (the system clock is monotonic): a dead key answers as a fresh one. A clock
// set back before a sweep finds the keys it dropped fresh where their kept
// state might have refused (docs/memory-store.md, "Expiry without timers").
// Tables drop dead keys on their own when they reach their key bound;
// call Sweep (for example every minute, or see [WithSweepEvery]) to return
// memory sooner after a burst of keys.
func (s *Store) Sweep() {
	now := s.clock.Now()
	for _, entries := range *s.tables.Load() {
		for _, e := range entries {
			e.t.sweep(now)
		}
	}
	s.holds.sweep(now)
}

// NonBlocking marks the store as never waiting on I/O ([sluice.NonBlocking]).
func (s *Store) NonBlocking() {}

// RuleStats describes one rule's table.
type RuleStats struct {
	Rule      string
	Limit     sluice.Limit
	Keys      int    // occupied slots, including dead keys not yet reused
	Evictions uint64 // live keys evicted to stay within the key bound
	// Overflows counts takes of new keys answered from the rule's shared,
	// strict overflow state, because their shard was full of limited keys.
	Overflows uint64
}

// Stats returns every table's statistics, for metrics.
func (s *Store) Stats() []RuleStats {
	var st []RuleStats
	for _, entries := range *s.tables.Load() {
		for _, e := range entries {
			keys, ev, ov := e.t.stats()
			m := e.t.meta()
			st = append(st, RuleStats{Rule: m.rule, Limit: m.limit, Keys: keys, Evictions: ev, Overflows: ov})
		}
	}
	return st
}

// Limiter is a handle on one rule of a store, for callers that know their
// rule up front: it skips the rule lookup of [Store.Take]. It shares its
// keys with Store.Take calls for the same rule and limit.
type Limiter struct {
	store *Store
	t     anyTable
	word  *wordTable // t, when it is a word table: a direct call
	meta  *tableMeta
}

// Limiter returns a handle on rule with limit l.
func (s *Store) Limiter(rule string, l sluice.Limit) (*Limiter, error) {
	t, err := s.table(rule, l)
	if err != nil {
		return nil, err
	}
	w, _ := t.(*wordTable)
	return &Limiter{store: s, t: t, word: w, meta: t.meta()}, nil
}

// Take takes cost units from key's bucket or window at the store's time.
func (l *Limiter) Take(key string, cost int64) (sluice.Decision, error) {
	if cost < 0 {
		return sluice.Decision{}, ErrNegativeCost
	}
	var r algo.Result
	l.take(key, cost, &r)
	var d sluice.Decision
	decide(&d, l.meta, &r)
	return d, nil
}

func (l *Limiter) take(key string, cost int64, r *algo.Result) {
	now := l.store.clock.Now()
	if l.word != nil {
		l.word.takeInto(key, now, cost, opTake, r)
		return
	}
	*r = l.t.take(key, now, cost, false)
}

// Refund gives units back to key: for a request that was admitted but never
// served. A key never becomes fuller than a fresh one.
func (l *Limiter) Refund(key string, units int64) {
	if units <= 0 {
		return
	}
	now := l.store.clock.Now()
	if l.word != nil {
		var r algo.Result
		l.word.takeInto(key, now, units, opRefund, &r)
		return
	}
	l.t.take(key, now, -units, false)
}

// Allow takes one unit from key and reports whether it was admitted.
func (l *Limiter) Allow(key string) bool {
	var r algo.Result
	l.take(key, 1, &r)
	return r.Allowed
}

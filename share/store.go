package share

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// Options configure a Store.
type Options struct {
	// Local is the gateway's embedded store: split and local rules count
	// there. Required.
	Local sluice.Store
	// Sharing returns each rule's sync setting (exact when nil).
	Sharing func(rule string) sluice.Sharing
	// Gateways returns how many gateways share the remote store (1 when
	// nil), for split.
	Gateways func() int
	// Scale, if set, returns the share of each rule's limit this gateway's
	// region has (1 for all of it), as a rule's regions and --region say.
	Scale func(rule string) float64
	// Portion, if set, returns the region's own share of each global rule's
	// limit (thousandths; 0 for a rule that is not global): its takes
	// count against the region's part (sluice.Limit.Portion), which the
	// region's agent moves (package global).
	Portion func(rule string) int64
	// Demand, if set, counts every decision of a global rule (Portion) for
	// the region's agent, refusals and all.
	Demand Demand
	// AllExact, if set, reports whether every rule is now exact and
	// unsharded at its whole limit (Sharing and Scale would say so for each
	// take). With no deny cache, calls then go to the store as they come,
	// without asking Sharing and Scale take by take. It is asked on every
	// call, so it must be cheap: an answer kept with the rule set.
	AllExact func() bool
	// Clock reads time for leases and the deny cache (the system clock by
	// default).
	Clock sluice.Clock
	// NoDenyCache turns the deny cache off.
	NoDenyCache bool
	// MaxEntries bounds each of the leases, sync counts and deny-cache
	// entries (default 100,000 each).
	MaxEntries int
	// ManualTick leaves the background work (lease expiry, sync flushes) to
	// calls of Tick, for deterministic simulations on a manual clock.
	ManualTick bool
}

// Demand counts the decisions of global rules (global.Demand).
type Demand interface {
	Add(rule, key string, cost int64, allowed bool)
}

// Store decides each take by its rule's sync mode (see the package doc). It
// implements sluice.Store: a call's takes are still all or nothing, whatever
// their modes. Create it with New; Close returns the units out on leases.
type Store struct {
	remote  sluice.Store
	o       Options
	clock   sluice.Clock
	leases  *leases
	counts  *periodic
	deny    *denyCache
	Hot     *HotKeys
	calls   atomic.Uint64 // calls to the remote store
	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once
}

// NonBlockingStore is a Store over a store that never blocks (the embedded
// store): it is itself sluice.NonBlocking, so the engine calls it without a
// deadline or breaker.
type NonBlockingStore struct{ *Store }

// NonBlocking implements sluice.NonBlocking.
func (NonBlockingStore) NonBlocking() {}

// Wrap returns New(remote, o) as a sluice.Store that is sluice.NonBlocking
// when remote is, and the *Store itself for its stats.
func Wrap(remote sluice.Store, o Options) (sluice.Store, *Store) {
	s := New(remote, o)
	if _, ok := remote.(sluice.NonBlocking); ok {
		return NonBlockingStore{s}, s
	}
	return s, s
}

// New returns a Store over remote.
func New(remote sluice.Store, o Options) *Store {
	if o.Clock == nil {
		o.Clock = sluice.NewSystemClock()
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = 100_000
	}
	s := &Store{remote: remote, o: o, clock: o.Clock, stop: make(chan struct{})}
	s.leases = newLeases(s, o.MaxEntries)
	s.counts = newPeriodic(s, o.MaxEntries)
	s.deny = newDenyCache(o.MaxEntries)
	s.deny.off = o.NoDenyCache
	s.Hot = NewHotKeys(128, 10*time.Second)
	if !o.ManualTick {
		s.stopped.Add(1)
		go s.maintain()
	}
	return s
}

// maintain returns expired leases and flushes sync counts.
func (s *Store) maintain() {
	defer s.stopped.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.Tick(ctx)
			cancel()
		case <-s.stop:
			return
		}
	}
}

// Tick does the background work now: it gives back the units of expired
// leases and flushes the sync counts whose interval has passed. A Store
// does it every 50 ms on its own; simulations on a manual clock call it as
// their clock moves.
func (s *Store) Tick(ctx context.Context) {
	s.leases.expire(ctx, s.clock.Now(), false)
	s.counts.flush(ctx, s.clock.Now(), false)
}

// Close gives back every unit out on a lease and flushes every sync count,
// then stops the background work: call it on shutdown.
func (s *Store) Close() {
	s.once.Do(func() {
		close(s.stop)
		s.stopped.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.leases.expire(ctx, s.clock.Now(), true)
		s.counts.flush(ctx, s.clock.Now(), true)
	})
}

// Stats are a Store's counters, for metrics.
type Stats struct {
	RemoteCalls uint64 // calls made to the remote store
	DenyHits    uint64 // takes refused from the deny cache, without a call
	LeasedOut   int64  // units held on leases now (the bound on under-admission)
	Leases      int    // live leases
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	out, n := s.leases.held()
	return Stats{RemoteCalls: s.calls.Load(), DenyHits: s.deny.hits.Load(), LeasedOut: out, Leases: n}
}

// call makes one call to the remote store.
func (s *Store) call(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	s.calls.Add(1)
	return s.remote.Take(ctx, takes, out)
}

// plan is how one take of a call is decided.
type plan struct {
	mode   sluice.SyncMode
	limit  sluice.Limit // scaled to the region's share
	sh     sluice.Sharing
	global bool  // a region's part of a global rule: its demand counted
	done   bool  // decided and consumed locally: undo if the call refuses
	undo   int64 // units to give back locally
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if len(out) < len(takes) {
		return errors.New("share: fewer decisions than takes")
	}
	now := instant{clock: s.clock}
	if s.deny.off && len(takes) > 0 && s.o.AllExact != nil && s.o.AllExact() {
		for i := range takes {
			s.sampleHot(&takes[i], &now)
		}
		return s.decideAsTheyCame(ctx, takes, out)
	}
	var pbuf [8]plan
	plans := pbuf[:0]
	for i := range takes {
		plans = append(plans, s.plan(&takes[i], &now))
	}
	if s.asTheyCame(takes, plans) {
		return s.decideAsTheyCame(ctx, takes, out)
	}
	// Local decisions first: they cost no call, and a refusal among them
	// spares the remote call.
	ok := true
	for i := range takes {
		p := &plans[i]
		if p.mode == sluice.SyncExact {
			continue
		}
		if err := s.decideLocal(ctx, &takes[i], p, now.get(), &out[i]); err != nil {
			s.undo(ctx, takes, plans)
			return err
		}
		ok = ok && out[i].Allowed
	}
	// The exact takes: refused at once from the deny cache, or in one call.
	sc := scratches.Get().(*scratch)
	defer sc.put()
	remote := sc.takes[:0]
	var ibuf [8]int
	idx := ibuf[:0]
	for i := range takes {
		if plans[i].mode != sluice.SyncExact {
			continue
		}
		tk := takes[i]
		tk.Limit = plans[i].limit
		if !s.deny.off {
			if d, hit := s.deny.check(&tk, now.get()); hit && !tk.Charge { // a charge applies, refused or not
				out[i] = d
				ok = false
				continue
			}
		}
		remote = append(remote, tk)
		idx = append(idx, i)
	}
	sc.used = len(remote)
	if len(remote) > 0 {
		if !ok { // a local or cached refusal: the rest only report
			for j := range remote {
				remote[j].DryRun = !remote[j].Charge
			}
		}
		decs := sc.decs[:0]
		for range remote {
			decs = append(decs, sluice.Decision{})
		}
		sc.grown(remote, decs)
		if err := s.remoteTakes(ctx, remote, decs, plans, idx); err != nil {
			s.undo(ctx, takes, plans)
			return err
		}
		for j, i := range idx {
			out[i] = decs[j]
			ok = ok && (decs[j].Allowed || remote[j].Settle || remote[j].Charge) // a settle or a charge refuses nothing
			if !s.deny.off {
				s.deny.learn(&remote[j], &decs[j], now.get())
			}
		}
	}
	if !ok {
		s.undo(ctx, takes, plans)
	}
	// The answer names the limit enforced here: a region's share of the
	// rule's limit (Options.Scale), so that the RateLimit fields and the
	// JSON API advertise what this gateway admits, not the whole.
	for i := range takes {
		out[i].Rule, out[i].Limit = takes[i].Rule, plans[i].limit
		if plans[i].global && s.o.Demand != nil && !takes[i].DryRun && !takes[i].Settle {
			s.o.Demand.Add(takes[i].Rule, takes[i].Key, takes[i].Cost, out[i].Allowed)
		}
	}
	return nil
}

// asTheyCame reports whether the store decides a call's takes as they
// came: at least one, each exact, unsharded and at its whole limit, and no
// deny cache to consult or teach. Such a call (on the embedded store, every
// call but those of lease, sync, split and local rules, auto rules' hot
// keys, shards, and regions that change the limit) is the store's alone;
// the rest of Take would copy the takes, call the store with the copies,
// and copy the decisions back unchanged.
func (s *Store) asTheyCame(takes []sluice.Take, plans []plan) bool {
	if !s.deny.off || len(takes) == 0 {
		return false
	}
	for i := range plans {
		if p := &plans[i]; p.mode != sluice.SyncExact || p.sh.Shards > 1 || p.limit != takes[i].Limit {
			return false
		}
	}
	return true
}

// decideAsTheyCame has the store decide a call's takes as they came
// (asTheyCame, AllExact).
func (s *Store) decideAsTheyCame(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if err := s.call(ctx, takes, out); err != nil {
		return err
	}
	for i := range takes {
		out[i].Rule, out[i].Limit = takes[i].Rule, takes[i].Limit
	}
	return nil
}

// scratch holds the copies of a call's exact takes and their decisions.
// Passed to the remote store through its interface, arrays on Take's stack
// would escape to the heap: about 1.6 KiB per call, a quarter of all the
// bytes the decision service allocated per call on Redis. A store must not
// retain its takes or decisions after Take returns (sluice.Store), so they
// are reused.
type scratch struct {
	takes []sluice.Take
	decs  []sluice.Decision
	used  int // entries of each written by this call
}

var scratches = sync.Pool{New: func() any {
	return &scratch{takes: make([]sluice.Take, 0, 8), decs: make([]sluice.Decision, 0, 8)}
}}

// grown keeps slices that outgrew the scratch, up to a size worth keeping.
func (sc *scratch) grown(takes []sluice.Take, decs []sluice.Decision) {
	// A slice that did not grow is the scratch's own: keeping it is a no-op.
	if cap(takes) <= maxScratch {
		sc.takes = takes[:0]
	}
	if cap(decs) <= maxScratch {
		sc.decs = decs[:0]
	}
}

// maxScratch bounds the takes a pooled scratch keeps room for.
const maxScratch = 64

// put clears the strings the scratch refers to and returns it to the pool.
func (sc *scratch) put() {
	clear(sc.takes[:min(sc.used, cap(sc.takes))])
	clear(sc.decs[:min(sc.used, cap(sc.decs))])
	sc.used = 0
	scratches.Put(sc)
}

// plan resolves a take's mode and limit.
func (s *Store) plan(tk *sluice.Take, now *instant) plan {
	p := plan{limit: tk.Limit}
	if s.o.Sharing != nil {
		p.sh = s.o.Sharing(tk.Rule).WithDefaults()
		p.mode = p.sh.Mode
	}
	if s.o.Scale != nil {
		p.limit = p.limit.Part(s.o.Scale(tk.Rule))
	}
	if s.o.Portion != nil {
		p.limit.Portion = s.o.Portion(tk.Rule)
		p.global = p.limit.Portion > 0
	}
	if p.mode == sluice.SyncAuto {
		p.mode = sluice.SyncExact
		if s.Hot.Observe(tk.Rule, tk.Key, now.get()) >= float64(p.sh.HotAbove) {
			p.mode = sluice.SyncLease
		}
	} else {
		s.sampleHot(tk, now)
	}
	// Peeks, dry runs and refunds of leased or synced keys go to the store
	// as they are: they consume nothing locally.
	if (p.mode == sluice.SyncLease || p.mode == sluice.SyncPeriodic) && (tk.Cost <= 0 || tk.DryRun) {
		p.mode = sluice.SyncExact
	}
	// Reservations live in the shared store, whatever the rule's mode: any
	// gateway may settle them. A take above a floor (a priority tier) is
	// decided where the whole count is.
	if tk.Hold != "" || tk.Floor > 0 || tk.Charge {
		p.mode = sluice.SyncExact // a charge writes back what was admitted elsewhere: to the count all share
	}
	return p
}

// sampleHot puts a take of a rule that is not auto in the hot-key list,
// 1 in hotSample: the tracker's lock stays off the common path.
func (s *Store) sampleHot(tk *sluice.Take, now *instant) {
	if rand.Uint32()%hotSample == 0 {
		s.Hot.ObserveN(tk.Rule, tk.Key, now.get(), hotSample)
	}
}

// instant is a call's time, read from the clock when first asked: a call
// that leases nothing, keeps no sync count and has no deny cache to consult
// (every exact take on the embedded store) needs none here, the store
// reading its own, and a clock read is a good part of what this layer
// costs such a take.
type instant struct {
	clock sluice.Clock
	t     int64
	read  bool
}

func (n *instant) get() int64 {
	if !n.read {
		n.t, n.read = n.clock.Now(), true
	}
	return n.t
}

// hotSample is the sampling of decisions for the hot-key list outside
// sync: auto rules.
const hotSample = 8

// localLimit is where a split or local rule counts in the embedded store:
// its own namespace, under the whole limit (local) or this gateway's share
// (split).
func (s *Store) localLimit(rule string, p *plan) (string, sluice.Limit) {
	if p.mode != sluice.SyncSplit {
		return rule + "#local", p.limit
	}
	n := 1
	if s.o.Gateways != nil {
		n = max(s.o.Gateways(), 1)
	}
	return rule + "#split", p.limit.Share(n)
}

// decideLocal decides a take of a split, local, lease or sync rule.
func (s *Store) decideLocal(ctx context.Context, tk *sluice.Take, p *plan, now int64, d *sluice.Decision) error {
	switch p.mode {
	case sluice.SyncSplit, sluice.SyncLocal:
		rule, l := s.localLimit(tk.Rule, p)
		lt := [1]sluice.Take{{Rule: rule, Key: tk.Key, Limit: l, Cost: tk.Cost, DryRun: tk.DryRun}}
		var o [1]sluice.Decision
		if err := s.o.Local.Take(ctx, lt[:], o[:]); err != nil {
			return err
		}
		*d = o[0]
		if d.Allowed && tk.Cost > 0 && !tk.DryRun {
			p.done, p.undo = true, tk.Cost
		}
		return nil
	case sluice.SyncLease:
		took, err := s.leases.take(ctx, tk, p, now, d)
		if took {
			p.done, p.undo = true, tk.Cost
		}
		return err
	case sluice.SyncPeriodic:
		took, err := s.counts.take(ctx, tk, p, now, d)
		if took {
			p.done, p.undo = true, tk.Cost
		}
		return err
	}
	return nil
}

// undo gives back what the local decisions of a refused call took.
func (s *Store) undo(ctx context.Context, takes []sluice.Take, plans []plan) {
	for i := range plans {
		p := &plans[i]
		if !p.done {
			continue
		}
		p.done = false
		tk := &takes[i]
		switch p.mode {
		case sluice.SyncSplit, sluice.SyncLocal:
			rule, l := s.localLimit(tk.Rule, p)
			lt := [1]sluice.Take{{Rule: rule, Key: tk.Key, Limit: l, Cost: -p.undo}}
			var o [1]sluice.Decision
			s.o.Local.Take(ctx, lt[:], o[:])
		case sluice.SyncLease:
			s.leases.giveBack(tk, p, p.undo)
		case sluice.SyncPeriodic:
			s.counts.giveBack(tk, p, p.undo)
		}
	}
}

// The remote store's optional abilities, passed through so the engine finds
// them on this Store as on the store it wraps.

// Forget drops the state of key under rule everywhere this Store keeps it:
// the remote store (if it can forget), the embedded store's split and local
// counts, and the deny cache.
func (s *Store) Forget(rule, key string) bool {
	s.deny.forget(rule, key)
	s.leases.forget(rule, key)
	found := false
	if f, ok := s.remote.(interface{ Forget(rule, key string) bool }); ok {
		found = f.Forget(rule, key)
	}
	if f, ok := s.o.Local.(interface{ Forget(rule, key string) bool }); ok {
		found = f.Forget(rule+"#split", key) || found
		found = f.Forget(rule+"#local", key) || found
	}
	return found
}

// Partition names the remote store node that serves a take's key, if the
// remote store has nodes.
func (s *Store) Partition(t *sluice.Take) string {
	if p, ok := s.remote.(interface{ Partition(*sluice.Take) string }); ok {
		return p.Partition(t)
	}
	return ""
}

// Preload prepares the remote store, if it needs it.
func (s *Store) Preload(ctx context.Context) error {
	if p, ok := s.remote.(interface{ Preload(context.Context) error }); ok {
		return p.Preload(ctx)
	}
	return nil
}

// DropLimit frees the state of rule under limit l in the remote store, if
// it keeps state per limit (the embedded store).
func (s *Store) DropLimit(rule string, l sluice.Limit) {
	if d, ok := s.remote.(interface{ DropLimit(string, sluice.Limit) }); ok {
		d.DropLimit(rule, l)
	}
}

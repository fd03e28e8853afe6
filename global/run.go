package global

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// maxAsks is the most keys one exchange carries; more go in several.
const maxAsks = 1000

// maxTracked bounds the keys a rule's agent follows: keys asked for
// lately, keys whose share it moved, keys other regions want.
const maxTracked = 20_000

// Runner is a process's side of its region's global rules, in the
// background. Every tick:
//
//  1. it adds the demand its decisions counted to the region's (Pool);
//  2. it takes or keeps the region's lead, or stops there;
//  3. for each global rule whose exchange is due, it reads the shares of
//     the keys the region uses, plans the exchange (Agent.Plan), gives up
//     what the plan releases before asking, exchanges with the home, and
//     applies the answer (Agent.Answer) when it comes within a period.
//
// A grant's lease counts from before the exchange was sent, on this
// process's clock; the region's store is given what is left of it, less
// a tick, so that the store's count ends first even when the write takes
// up to a tick longer to reach it than the request took to reach the
// home (see the package doc).
type Runner struct {
	Region string
	ID     string // this process, for the region's lead
	Store  Region // the region's store; a Pool when processes share it
	Home   Home
	Demand *Demand
	// Rules returns the global rules in force, each limit with the
	// region's own share as its Portion.
	Rules  func() []Rule
	Clock  sluice.Clock // the system clock when nil
	Logger *slog.Logger

	agent     Agent
	mu        sync.Mutex
	tracked   map[string]*tracked // by rule
	lastErr   map[string]string
	exchanges atomic.Uint64
	failures  atomic.Uint64
	leads     atomic.Bool
}

// tracked is what the runner keeps of one rule's keys between ticks.
type tracked struct {
	limit sluice.Limit
	keys  map[string]*trackedKey
}

type trackedKey struct {
	asked, short int64 // since the key was first tracked
	lastUsed     int64 // ns, this process's clock
	moved        bool  // its share was other than own when last seen
}

// RunnerStats are a runner's counters.
type RunnerStats struct {
	Exchanges, Failures uint64
	Dropped             uint64 // decisions uncounted as demand (Demand.Dropped)
	Leads               bool
}

// Stats returns the runner's counters.
func (r *Runner) Stats() RunnerStats {
	return RunnerStats{Exchanges: r.exchanges.Load(), Failures: r.failures.Load(), Dropped: r.Demand.Dropped(), Leads: r.leads.Load()}
}

func (r *Runner) now() int64 {
	if r.Clock == nil {
		r.Clock = sluice.NewSystemClock()
	}
	return r.Clock.Now()
}

// Run runs the ticks until ctx is done.
func (r *Runner) Run(ctx context.Context) {
	r.agent.Region = r.Region
	quick := false
	for {
		wait := r.tick()
		if !quick && r.confirming() {
			// A shrunk share, said at once (the coordinator frees it only
			// then); once in a row, so a failing store is not hammered.
			wait = 0
		}
		quick = wait == 0
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		r.Step(ctx)
	}
}

// confirming reports whether a rule's exchange is due at once.
func (r *Runner) confirming() bool {
	if !r.leads.Load() {
		return false
	}
	for _, rule := range r.Rules() {
		if r.agent.Confirming(rule.ID) {
			return true
		}
	}
	return false
}

// tick is the shortest tick among the rules in force.
func (r *Runner) tick() time.Duration {
	t := 250 * time.Millisecond
	for _, rule := range r.Rules() {
		o := rule.Options.WithDefaults()
		t = min(t, o.Tick())
	}
	return t
}

// Step runs one tick.
func (r *Runner) Step(ctx context.Context) {
	r.agent.Region = r.Region
	rules := r.Rules()
	counts := r.Demand.Take()
	pool, shared := r.Store.(Pool)
	if shared {
		for rule, c := range counts {
			cctx, cancel := context.WithTimeout(ctx, r.tick())
			err := pool.AddDemand(cctx, rule, c)
			cancel()
			r.report("demand "+rule, err)
		}
		cctx, cancel := context.WithTimeout(ctx, r.tick())
		lead, err := pool.Lead(cctx, r.ID, 3*r.tick())
		cancel()
		r.report("lead", err)
		r.leads.Store(lead && err == nil)
		if !lead || err != nil {
			return
		}
	} else {
		r.leads.Store(true)
	}
	for i := range rules {
		rule := &rules[i]
		demand := counts[rule.ID]
		if shared {
			cctx, cancel := context.WithTimeout(ctx, r.tick())
			d, err := pool.TakeDemand(cctx, rule.ID)
			cancel()
			if r.report("demand "+rule.ID, err) {
				continue
			}
			demand = d
		}
		r.exchange(ctx, rule, demand)
	}
	r.forgetRules(rules)
}

// report logs an error once until it changes or clears, and says whether
// there was one.
func (r *Runner) report(what string, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastErr == nil {
		r.lastErr = map[string]string{}
	}
	msg := ""
	if err != nil {
		msg = err.Error()
		r.failures.Add(1)
	}
	if r.lastErr[what] != msg && r.Logger != nil {
		if err != nil {
			r.Logger.Warn("global rules: "+what+" failed; shares stay as they are and leases end on their own", "region", r.Region, "err", err)
		} else {
			r.Logger.Info("global rules: "+what+" works again", "region", r.Region)
		}
	}
	r.lastErr[what] = msg
	return err != nil
}

// exchange runs one rule's tick on the lead: read, plan, release, ask,
// apply.
func (r *Runner) exchange(ctx context.Context, rule *Rule, demand []Count) {
	o := rule.Options.WithDefaults()
	own := rule.Limit.Portion
	tr := r.track(rule, demand)
	keys := make([]string, 0, len(tr.keys))
	for k := range tr.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cctx, cancel := context.WithTimeout(ctx, o.Tick())
	shares, err := r.Store.Shares(cctx, rule.ID, rule.Limit, keys)
	cancel()
	if r.report("read shares "+rule.ID, err) {
		return
	}
	now := r.now()
	parts := make([]Part, len(shares))
	for i, sh := range shares {
		tk := tr.keys[sh.Key]
		tk.moved = sh.Share != own
		parts[i] = Part{Key: sh.Key, Held: sh.Share, Own: own, Asked: tk.asked, Short: tk.short}
		if sh.Lease > 0 {
			parts[i].Until = (now + int64(sh.Lease)) / 1000
		}
	}
	asks, release, due := r.agent.Plan(rule, &o, now/1000, parts)
	if !due {
		return
	}
	if len(release) > 0 {
		untils := map[string]int64{}
		for _, p := range parts {
			untils[p.Key] = p.Until
		}
		for i := range release {
			if release[i].Share > own {
				release[i].Until = untils[release[i].Key] // a lease kept, as it was
			}
		}
		if !r.apply(ctx, rule, &o, release) {
			return // asks say what it holds after the release: not sent unless applied
		}
	}
	for start := 0; start < len(asks) || start == 0; start += maxAsks {
		chunk := asks[start:min(start+maxAsks, len(asks))]
		sent := r.now() / 1000
		cctx, cancel := context.WithTimeout(ctx, o.Period)
		grants, wanted, err := r.Home.Exchange(cctx, rule.ID, r.Region, &o, chunk)
		cancel()
		r.exchanges.Add(1)
		if r.report("exchange "+rule.ID, err) {
			return // no answer in time: never applied; leases end on their own
		}
		sets := r.agent.Answer(rule, &o, sent, chunk, grants, wanted)
		r.mu.Lock()
		for _, k := range wanted {
			if _, ok := tr.keys[k]; !ok && len(tr.keys) < maxTracked {
				tr.keys[k] = &trackedKey{moved: true}
			}
		}
		r.mu.Unlock()
		r.apply(ctx, rule, &o, sets)
		if len(asks) == 0 {
			break
		}
	}
}

// apply sets shares in the region's store; a share above the own one gets
// what is left of its lease less a tick, or falls to the own share when
// nothing is left.
func (r *Runner) apply(ctx context.Context, rule *Rule, o *Options, sets []Set) bool {
	if len(sets) == 0 {
		return true
	}
	own := rule.Limit.Portion
	now := r.now()
	out := make([]Share, 0, len(sets))
	for _, s := range sets {
		sh := Share{Key: s.Key, Share: s.Share}
		if s.Share > own {
			sh.Lease = time.Duration(s.Until*1000-now) - o.Tick()
			if sh.Lease <= 0 {
				sh.Share, sh.Lease = own, 0
			}
		}
		out = append(out, sh)
	}
	cctx, cancel := context.WithTimeout(ctx, o.Tick())
	err := r.Store.SetShares(cctx, rule.ID, rule.Limit, out)
	cancel()
	return !r.report("set shares "+rule.ID, err)
}

// track adds demand to the rule's keys and forgets keys nobody used for
// four periods whose share is the own one.
func (r *Runner) track(rule *Rule, demand []Count) *tracked {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tracked == nil {
		r.tracked = map[string]*tracked{}
	}
	tr := r.tracked[rule.ID]
	if tr == nil || tr.limit != rule.Limit {
		tr = &tracked{limit: rule.Limit, keys: map[string]*trackedKey{}} // a new limit is a new table
		r.tracked[rule.ID] = tr
	}
	now := r.now()
	for _, c := range demand {
		tk := tr.keys[c.Key]
		if tk == nil {
			if len(tr.keys) >= maxTracked {
				continue
			}
			tk = &trackedKey{}
			tr.keys[c.Key] = tk
		}
		tk.asked += c.Asked
		tk.short += c.Short
		tk.lastUsed = now
	}
	idle := int64(4 * rule.Options.WithDefaults().Period)
	for k, tk := range tr.keys {
		if !tk.moved && now-tk.lastUsed > idle {
			delete(tr.keys, k)
		}
	}
	return tr
}

// forgetRules drops the keys of rules no longer in force.
func (r *Runner) forgetRules(rules []Rule) {
	r.mu.Lock()
	defer r.mu.Unlock()
	live := map[string]bool{}
	for _, rule := range rules {
		live[rule.ID] = true
	}
	for id := range r.tracked {
		if !live[id] {
			delete(r.tracked, id)
		}
	}
}

package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// A check's life against the store, in the order Check runs it, and the
// arithmetic of costs its steps share.

// CheckOptions adjust one check.
type CheckOptions struct {
	// Cost multiplies every rule's cost (0 means 1).
	Cost int64
	// DryRun decides without consuming anything.
	DryRun bool
	// Estimate, when > 0, is what the rules with a reserve section take
	// (times their cost), instead of their own estimate.
	Estimate int64
	// Reserve opens a reservation on the reserve rules, to settle at the
	// real cost with Settle once it is known (see Result.Reservation).
	// Without it they take the estimate for good.
	Reserve bool
	// Via names the face in the decision log (default "http"); with
	// LogPath the log line also gives the request's path, for faces whose
	// paths name a fixed set of operations (a gRPC method).
	Via     string
	LogPath bool
}

// Check evaluates req against the rule set and fills res (which may be
// reused across calls; its slices keep their capacity). It returns an error
// only for a caller's mistake, such as a negative cost: store failures are
// answered by each rule's fail mode.
func (e *Engine) Check(ctx context.Context, req *rules.Request, opt CheckOptions, res *Result) error {
	if opt.Cost < 0 {
		return fmt.Errorf("engine: cost must be >= 0, got %d", opt.Cost)
	}
	if opt.Estimate < 0 {
		return fmt.Errorf("engine: estimate must be >= 0, got %d", opt.Estimate)
	}
	mult := opt.Cost
	if mult == 0 {
		mult = 1
	}
	rs := e.set.Load()
	res.reset(rs)
	res.estimate, res.reserve = opt.Estimate, opt.Reserve && !opt.DryRun
	if !e.match(rs, req, res, checks, false) {
		return nil
	}
	if rs.cfg.Priority != nil {
		res.levelOf(req) // for Tier, whether a rule has tiers or not
	}
	if !res.blocked && !e.checkLocks(ctx, res, opt.DryRun) {
		e.enforced(ctx, req, res, mult, opt.DryRun)
	}
	e.shadowed(ctx, res, mult, opt.DryRun)
	res.combine()
	e.reserved(res)
	for i := range res.Statuses {
		res.Statuses[i].count(res.Allowed)
	}
	if !res.Allowed && !opt.DryRun {
		e.penalize(ctx, res)
	}
	if !opt.DryRun {
		via := opt.Via
		if via == "" {
			via = "http"
		}
		path := ""
		if opt.LogPath {
			path = res.Path
		}
		e.decisions.log(res, via, path)
		e.observe(res)
	}
	return nil
}

// checks selects the rules Check evaluates: every rule but Envoy's
// descriptor rules, which answer Envoy's service only.
func checks(r *rule) bool { return r.Envoy == nil }

// checkLocks peeks at the penalty locks of the matched rules. A locked key
// rejects the request before anything else is consumed. Locks are kept in
// the store and mirrored in the per-node fallback store, and a key locked in
// either is locked: a lock holds while the store fails, and one placed while
// it failed holds when it is back.
func (e *Engine) checkLocks(ctx context.Context, res *Result, dry bool) bool {
	res.takes = res.takes[:0]
	res.idx = res.idx[:0]
	for i := range res.matched {
		m := &res.matched[i]
		if m.r.Penalty != nil && !m.r.Shadow {
			res.takes = append(res.takes, sluice.Take{Rule: m.r.lockID, Key: m.key, Limit: m.r.lockLimit})
			res.idx = append(res.idx, i)
		}
	}
	if len(res.takes) == 0 {
		return false
	}
	decs := res.decisions(len(res.takes))
	storeErr := e.client.Take(ctx, storecall.Call{Spent: &res.StoreTime}, res.takes, decs)
	res.lockDecs = slices.Grow(res.lockDecs[:0], len(res.takes))[:len(res.takes)]
	local := res.lockDecs
	localOK := e.fallback != nil && e.fallback.Take(ctx, res.takes, local) == nil
	if storeErr != nil && !localOK {
		return false // the lock is unknown: let the rules' own fail modes decide
	}
	locked := false
	for j := range res.takes {
		d := decs[j]
		if storeErr != nil || (localOK && local[j].Remaining == 0 && d.Remaining > 0) {
			d = local[j]
		}
		if d.Remaining == 0 {
			m := &res.matched[res.idx[j]]
			res.add(m.r, m.key, sluice.Decision{
				Rule: m.r.ID, Limit: m.r.Limit, Reason: sluice.ReasonLocked,
				RetryAfter: d.ResetAfter, ResetAfter: d.ResetAfter,
			})
			locked = true
		}
	}
	return locked
}

// enforced takes from every matched enforced rule in one store call.
func (e *Engine) enforced(ctx context.Context, req *rules.Request, res *Result, mult int64, dry bool) {
	res.takes = res.takes[:0]
	res.idx = res.idx[:0]
	var wait time.Duration // the longest a matched rule waits for a slow store
	for i := range res.matched {
		m := &res.matched[i]
		if m.r.Shadow {
			continue
		}
		wait = max(wait, m.r.SlowStoreWait)
		cost := mulCost(m.r.Cost, mult)
		// Built in place: a Take is large, and this is the hot path.
		res.takes = append(res.takes, sluice.Take{
			Rule: m.r.ID, Key: m.key, Limit: m.r.store, Cost: cost,
			DryRun: dry || len(m.r.CountOn) > 0, // countOn rules are charged after the response
			Was:    m.was,
		})
		tk := &res.takes[len(res.takes)-1]
		if m.r.Adaptive {
			tk.Cost = inflate(cost, res.factorOf(e.pressure))
		}
		if m.r.Tiers != nil {
			capacity := m.r.store.Capacity()
			tk.Floor = m.r.Tiers.Floor(res.levelOf(req), capacity)
			if f := res.factor; m.r.Adaptive && f < 1 {
				// The tiers above keep their share in requests at the
				// reduced price: the pressure falls on the lowest first.
				tk.Floor = min(capacity, int64(math.Ceil(float64(tk.Floor)/f)))
			}
		}
		if rv := m.r.Reserve; rv != nil {
			tk.Cost = mulCost(m.r.Cost, res.estimateFor(rv, req))
			if res.reserve {
				tk.Hold, tk.HoldFor = res.holdID(), rv.Deadline
			}
		}
		res.idx = append(res.idx, i)
	}
	if len(res.takes) == 0 {
		return
	}
	decs := res.decisions(len(res.takes))
	if err := e.client.Take(ctx, storecall.Call{Owing: true, Wait: wait, Spent: &res.StoreTime}, res.takes, decs); err != nil {
		e.failed(ctx, res, err, dry)
		return
	}
	for j := range decs {
		d := decs[j]
		m := &res.matched[res.idx[j]]
		reduced := false
		if m.r.Adaptive {
			reduced = unscale(&d, m.r, res.factor)
			if d.Reason == sluice.ReasonTooLarge && res.factor < 1 && mulCost(m.r.Cost, mult) <= m.r.Limit.Capacity() {
				// Too large only at the reduced rate: the pressure's
				// refusal, to retry once it lifts, not a cost that can
				// never pass.
				d.Reason, d.RetryAfter, reduced = sluice.ReasonLimited, time.Second, true
			}
		}
		st := res.add(m.r, m.key, d)
		st.Reduced, st.Override = reduced, m.override
		if m.r.Tiers != nil {
			st.Tier = res.level
		}
		switch {
		case dry || res.takes[j].DryRun:
			if d.Allowed && len(m.r.CountOn) > 0 && !dry {
				st.charge = res.takes[j].Cost
			}
		case d.Allowed:
			st.taken = res.takes[j].Cost
			st.hold = res.takes[j].Hold != ""
			e.follow(ctx, res, m.r, m.r.store, &res.takes[j], &decs[j])
		default:
			e.follow(ctx, res, m.r, m.r.store, &res.takes[j], &decs[j])
		}
	}
}

// Refund gives back what an allowed check took from the enforced rules, for
// a request that was admitted but never served: its client gave up while a
// leaky-queue rule delayed it, or a later check refused it. Call it at most
// once per result.
func (e *Engine) Refund(ctx context.Context, res *Result) {
	var takes [1]sluice.Take
	var out [1]sluice.Decision
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.taken == 0 || st.FailedOpen {
			continue
		}
		takes[0] = sluice.Take{Rule: st.r.ID, Key: st.key, Limit: st.r.store, Cost: -st.taken}
		if st.hold { // the reservation closes with it
			takes[0].Hold = res.hold
		}
		e.client.Take(ctx, storecall.Call{}, takes[:], out[:])
		st.taken, st.hold = 0, false
	}
}

// shadowed evaluates the shadow rules in a call of their own: they count as
// if enforced, but never decide the request.
func (e *Engine) shadowed(ctx context.Context, res *Result, mult int64, dry bool) {
	res.takes = res.takes[:0]
	res.idx = res.idx[:0]
	for i := range res.matched {
		if m := &res.matched[i]; m.r.Shadow {
			res.takes = append(res.takes, sluice.Take{Rule: m.r.ID, Key: m.key, Limit: m.r.Limit, Cost: mulCost(m.r.Cost, mult), DryRun: dry, Was: m.wasOf(m.r.Limit)})
			res.idx = append(res.idx, i)
		}
	}
	if len(res.takes) == 0 {
		return
	}
	decs := res.decisions(len(res.takes))
	if err := e.client.Take(ctx, storecall.Call{}, res.takes, decs); err != nil {
		return // a shadow rule never affects the answer, not even by failing
	}
	for j, d := range decs {
		m := &res.matched[res.idx[j]]
		res.add(m.r, m.key, d).Shadow = true
	}
}

// penalize counts the rejections of penalty rules and locks the keys that
// reach their rule's After within its period. Counts and locks go to the
// store, or to the fallback store while the store fails (orFallback); a
// lock placed in the store is mirrored in the fallback, so it holds if the
// store fails.
func (e *Engine) penalize(ctx context.Context, res *Result) {
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.r == nil || st.r.Penalty == nil || st.Shadow || st.Allowed || st.Reason != sluice.ReasonLimited {
			continue
		}
		var out [1]sluice.Decision
		count := []sluice.Take{{Rule: st.r.rejectsID, Key: st.key, Limit: st.r.rejectsLimit, Cost: 1}}
		if e.orFallback(ctx, e.client.Take(ctx, storecall.Call{}, count, out[:]), count, out[:]) != nil || out[0].Remaining > 0 {
			continue
		}
		lock := []sluice.Take{{Rule: st.r.lockID, Key: st.key, Limit: st.r.lockLimit, Cost: 1}}
		if e.orFallback(ctx, e.client.Take(ctx, storecall.Call{}, lock, out[:]), lock, out[:]) == nil && out[0].Allowed {
			if e.fallback != nil {
				e.fallback.Take(ctx, lock, out[:]) // the mirror (a second take is refused: no harm)
			}
			st.r.stats.locked.Add(1)
			e.log.Info("sluice: key locked by penalty", "rule", st.r.ID, "for", st.r.Penalty.Block)
			if e.onLock != nil {
				e.onLock(st.r.ID, st.key, st.r.Penalty.Block)
			}
		}
	}
}

// orFallback makes the same call on the fallback store if err says the
// store's failed.
func (e *Engine) orFallback(ctx context.Context, err error, takes []sluice.Take, out []sluice.Decision) error {
	if err != nil && e.fallback != nil {
		err = e.fallback.Take(ctx, takes, out)
	}
	return err
}

func (res *Result) decisions(n int) []sluice.Decision {
	res.decs = slices.Grow(res.decs[:0], n)
	return res.decs[:n]
}

// levelOf returns the request's priority tier under cfg, computed once per
// check.
func (res *Result) levelOf(req *rules.Request) int {
	if !res.leveled {
		res.level, res.leveled = res.priority.Level(req), true
	}
	return res.level
}

// factorOf returns the pressure factor for this check, read once.
func (res *Result) factorOf(pressure func() float64) float64 {
	if !res.factored {
		res.factor, res.factored = 1, true
		if pressure != nil {
			if f := pressure(); f > 0 && f < 1 {
				res.factor = f
			}
		}
	}
	return res.factor
}

// inflate returns what cost takes from an adaptive rule's store limit at
// factor f: cost * AdaptiveScale / f, rounded up, so the rule admits its
// rate times f.
func inflate(cost int64, f float64) int64 {
	scaled := mulCost(cost, rules.AdaptiveScale)
	if f >= 1 {
		return scaled
	}
	x := math.Ceil(float64(scaled) / f)
	if x >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(x)
}

// unscale turns a decision on adaptive rule r's store limit into the
// rule's units at factor f: what is left at the current price of a unit,
// and the rule's limit reduced by f. It reports whether it is a refusal
// under a reduced limit.
func unscale(d *sluice.Decision, r *rule, f float64) bool {
	unit := inflate(1, f)
	reduced := !d.Allowed && d.Reason == sluice.ReasonLimited && f < 1
	d.Remaining /= unit
	d.Limit = r.Limit
	if f < 1 {
		d.Limit.Rate = max(int64(float64(r.Limit.Rate)*f), 1)
		if r.Limit.Burst > 0 {
			d.Limit.Burst = max(int64(float64(r.Limit.Burst)*f), 1)
		}
	}
	return reduced
}

// mulCost returns a*b for non-negative costs, saturating at math.MaxInt64: a
// saturated cost exceeds every burst, so it is refused as
// cost-exceeds-limit and can never wrap into a small or negative take.
func mulCost(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/rules"
)

// Options configure an Engine.
type Options struct {
	// Store keeps the counts. Required.
	Store sluice.Store
	// Load is how ReloadFile loads several rule files together.
	Load rules.LoadOptions
	// Fallback keeps the per-node counts applied while the store fails and
	// rules fail open (see Gateways): usually the embedded store. Without
	// one, failing open admits everything.
	Fallback sluice.Store
	// StoreTimeout, if set, is a fixed deadline for every call to Store.
	// By default the deadline adapts to the store's latency (see guard.go):
	// four times its recent peak, within [MinStoreTimeout, StoreTimeoutMax].
	// Stores that never block (sluice.NonBlocking) are called without one.
	StoreTimeout time.Duration
	// StoreTimeoutMax caps the adaptive deadline (default MaxStoreTimeout).
	StoreTimeoutMax time.Duration
	// BreakerFailures is how many failed store calls, at least half of the
	// calls within BreakerWindow, open a partition's circuit breaker
	// (defaults 20 and 10 s); BreakerOpenFor is how long it stays open
	// before letting one probe through (default 1 s).
	BreakerFailures uint32
	BreakerWindow   time.Duration
	BreakerOpenFor  time.Duration
	// OnBreakerChange, if set, is told of every breaker state change.
	OnBreakerChange func(from, to string)
	// StoreName names the store in the breaker's log lines when it is one
	// node (a store that is not a Partitioner): its URL, without secrets.
	StoreName string
	// Gateways, if set, returns how many gateways share the store (the live
	// members, or a configured number). While the store fails, a fail-open
	// rule without its own fallback limit counts its share, limit/N, in the
	// Fallback store, so N degraded gateways together admit about the limit,
	// not N times it. Without it N is 1.
	Gateways func() int
	// Logger receives reload and breaker events (default slog.Default()).
	Logger *slog.Logger
	// MaxOverrides bounds the distinct Envoy limit overrides counted at once
	// (default DefaultMaxOverrides).
	MaxOverrides int
	// OnStoreCall, if set, is told how long each call to a blocking store
	// took and how it ended (nil, a store error, a deadline, ErrBreakerOpen):
	// for metrics.
	OnStoreCall func(d time.Duration, err error)
	// DecisionLog, if set, logs decisions (rejections, or all): see
	// DecisionLog.
	DecisionLog *DecisionLog
	// OnReject, if set, is told the deciding rule and key of every rejected
	// request, and OnLock of every key a penalty locks and for how long:
	// for a live view (server's /ui). key is only valid during the call.
	OnReject func(rule, key string)
	OnLock   func(rule, key string, d time.Duration)
	// Pressure, if set, is the protected service's pressure factor in
	// (0, 1] (concurrency.Pressure.Factor): rules marked adaptive admit
	// their rate times it. Without it they admit their rate.
	Pressure func() float64
}

// Engine evaluates requests against the current rule set. It is safe for
// concurrent use.
type Engine struct {
	client    *StoreClient      // every store call goes through it
	load      rules.LoadOptions // how reloads load several files
	fallback  sluice.Store
	gateways  func() int
	log       *slog.Logger
	set       atomic.Pointer[ruleSet]
	reloads   [2]atomic.Uint64 // ok, failed
	overrides *overrides
	decisions *DecisionLog
	onReject  func(rule, key string)
	onLock    func(rule, key string, d time.Duration)
	pressure  func() float64

	// fileMu serialises ReloadFile; files is the digest of the rule files
	// it last tried, so one change seen by both the file watcher and a
	// SIGHUP loads (and logs, and counts) once.
	fileMu   sync.Mutex
	files    [sha256.Size]byte
	filesErr error
}

// New returns an engine serving cfg.
func New(cfg *rules.Config, o Options) (*Engine, error) {
	if o.Store == nil {
		return nil, errors.New("engine: Options.Store is required")
	}
	if cfg == nil {
		return nil, errors.New("engine: no rule set")
	}
	e := &Engine{load: o.Load, fallback: o.Fallback, log: o.Logger, gateways: o.Gateways, decisions: o.DecisionLog,
		onReject: o.OnReject, onLock: o.OnLock, pressure: o.Pressure}
	dropper, _ := o.Store.(LimitDropper)
	e.overrides = newOverrides(o.MaxOverrides, dropper)
	if e.log == nil {
		e.log = slog.Default()
	}
	e.client = newStoreClient(&o, e.log, func(rule string) bool {
		r := e.set.Load().find(rule)
		return r != nil && writesBack(r)
	})
	e.set.Store(compile(cfg))
	return e, nil
}

// Config returns the rule set being served.
func (e *Engine) Config() *rules.Config { return e.set.Load().cfg }

// ruleSet is a rules.Config compiled for evaluation.
type ruleSet struct {
	cfg   *rules.Config
	rules []*rule
	envoy map[string]*envoyNode // descriptor trees, by domain
}

type rule struct {
	*rules.Rule
	// store is the limit counted in the store: the rule's, or for an
	// adaptive rule the same in 1/rules.AdaptiveScale units.
	store                         sluice.Limit
	lockID, rejectsID, fallbackID string
	lockLimit, rejectsLimit       sluice.Limit
	stats                         counters
}

func compile(cfg *rules.Config) *ruleSet {
	rs := &ruleSet{cfg: cfg}
	for _, r := range cfg.Rules {
		c := &rule{Rule: r, fallbackID: r.ID + "#fallback", store: r.Limit}
		if r.Adaptive {
			c.store = rules.AdaptiveLimit(r.Limit)
		}
		if p := r.Penalty; p != nil {
			c.lockID, c.rejectsID = r.ID+"#lock", r.ID+"#rejections"
			c.lockLimit = sluice.Limit{Rate: 1, Period: p.Block, Burst: 1}
			c.rejectsLimit = sluice.Limit{Rate: p.After, Period: r.Limit.Period, Algorithm: sluice.SlidingLog}
			if p.After > sluice.MaxLogLimit {
				c.rejectsLimit.Algorithm = sluice.SlidingWindow
			}
		}
		rs.rules = append(rs.rules, c)
		if r.Envoy != nil {
			rs.addEnvoy(c)
		}
	}
	return rs
}

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
	path, ok := rs.cfg.Paths.Normalize(req.Path)
	if !ok {
		res.refuseBadRequest(rs.cfg.Paths.Why(req.Path))
		return nil
	}
	res.Path, req.Path = path, rs.cfg.Paths.MatchForm(path)
	req.Method = upperMethod(req.Method)

	// Match the rules and build their keys into one buffer.
	for _, r := range rs.rules {
		if r.Envoy != nil {
			continue // descriptor rules answer Envoy's service only
		}
		route, ok := r.Match.Matches(req.Method, req.Host, req.Path)
		if !ok || !r.Selects(req, route) {
			continue
		}
		start := len(res.keyBuf)
		var state rules.KeyState
		res.keyBuf, state = ruleKey(res.keyBuf, r, req, route, rs.cfg.IPv6Prefix)
		switch {
		case state == rules.KeyFound:
		case state == rules.KeyAmbiguous && !r.Shadow:
			res.refuseBadRequest(fmt.Sprintf("the %q limit counts by a field given twice with different values, which servers read in different ways", r.ID))
			return nil
		case state == rules.KeyBodyTooLarge && !r.Shadow:
			res.refuseInvalid(fmt.Sprintf("the %q limit counts by a field of its body, which is larger than the %d bytes read to find it", r.ID, rules.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return nil
		case state == rules.KeyUnreadable && !r.Shadow:
			res.refuseInvalid(fmt.Sprintf("the %q limit counts by a field of its body, which is compressed, not UTF-8, or JSON or multipart that not every server reads alike", r.ID), http.StatusUnsupportedMediaType)
			return nil
		case r.MissingKey == rules.MissingReject && !r.Shadow:
			res.add(r, "", sluice.Decision{Rule: r.ID, Limit: r.Limit, Reason: sluice.ReasonMissingKey})
			continue
		default: // skipped (onMissingKey: skip), or a shadow rule that could not read its key
			r.stats.skipped.Add(1)
			res.Skipped++
			res.MissingKey = append(res.MissingKey, Skip{Rule: r.ID, Limit: r.Limit})
			continue
		}
		res.matched = append(res.matched, matched{r: r, start: start, end: len(res.keyBuf)})
	}
	if rs.cfg.Priority != nil {
		res.levelOf(req) // for Tier, whether a rule has tiers or not
	}
	// The buffer is complete: keys may now point into it.
	for i := range res.matched {
		m := &res.matched[i]
		m.key = view.String(res.keyBuf[m.start:m.end])
	}

	if !e.checkLocks(ctx, res, opt.DryRun) {
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
		e.decisions.log(res, "http")
		e.observe(res)
	}
	return nil
}

// observe tells OnReject of a rejection.
func (e *Engine) observe(res *Result) {
	if e.onReject == nil || res.Allowed {
		return
	}
	for i := range res.Statuses {
		if st := &res.Statuses[i]; st.Rule == res.Decision.Rule && !st.Shadow {
			e.onReject(st.Rule, st.key)
			return
		}
	}
}

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
	var storeErr error
	if e.client.local {
		storeErr = e.client.call(ctx, res.takes, decs)
	} else {
		start := time.Now()
		storeErr = e.client.call(ctx, res.takes, decs)
		res.StoreTime += time.Since(start)
	}
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
	if err := e.callOwing(ctx, res, wait, res.takes, decs); err != nil {
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
		st.Reduced = reduced
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

// follow keeps a fail-open rule's share of key in the fallback store at
// what the store last said was left of it: after each store decision of a
// take that counts, the fallback's level for the key is set to the
// decision's remaining (its level, above a tier's floor: Remaining +
// Floor), in raw units under the rule's whole limit. A degraded answer
// then costs n units per unit (see degradedLimit), so this gateway admits
// at most its part, (left + refill since)/n, and the parts of n gateways
// add up to what the store had left, whatever the load balancer sent each
// one. The bound that remains is written down in docs/redis.md ("The
// bound over a window"): a gateway's last look is as old as its last
// reply, so what the store admitted for the others since then counts 1/n.
//
// Setting a level is a peek and a charge or refund of the difference, not
// one atomic step: a reply that races another for the same key on this
// gateway may leave the level off by one reply's difference until the
// next reply sets it again.
//
// A rule with its own fallback limit keeps that limit per gateway, less
// what this gateway admitted through the store (each admitted take is
// charged there too). The take and decision live in res: arrays on the
// stack would escape through the store's interface, an allocation per
// take.
func (e *Engine) follow(ctx context.Context, res *Result, r *rule, l sluice.Limit, tk *sluice.Take, d *sluice.Decision) {
	if e.client.local || e.fallback == nil || r.FailClosed {
		return
	}
	fb := &res.mirrorTake[0]
	if r.FallbackSet {
		if d.Allowed && tk.Cost > 0 {
			*fb = sluice.Take{Rule: r.fallbackID, Key: tk.Key, Limit: r.Fallback, Cost: tk.Cost, Charge: tk.Charge}
			e.fallback.Take(ctx, res.mirrorTake[:], res.mirrorOut[:])
		}
		return
	}
	left := d.Remaining
	if tk.Floor > 0 { // saturating: a floor is at most the capacity
		left = min(left, math.MaxInt64-tk.Floor) + tk.Floor
	}
	*fb = sluice.Take{Rule: r.fallbackID, Key: tk.Key, Limit: l} // a peek
	if e.fallback.Take(ctx, res.mirrorTake[:], res.mirrorOut[:]) != nil {
		return
	}
	switch diff := res.mirrorOut[0].Remaining - left; {
	case diff > 0:
		fb.Cost, fb.Charge = diff, true
	case diff < 0:
		fb.Cost = diff // a refund: never fuller than a fresh key
	default:
		return
	}
	e.fallback.Take(ctx, res.mirrorTake[:], res.mirrorOut[:])
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
		e.client.call(ctx, takes[:], out[:])
		st.taken, st.hold = 0, false
	}
}

// failed answers the enforced rules of a request whose store call failed:
// fail-closed rules reject, fail-open rules fall back to their per-node limit.
func (e *Engine) failed(ctx context.Context, res *Result, err error, dry bool) {
	res.StoreError = err
	for j, tk := range res.takes {
		m := &res.matched[res.idx[j]]
		d := sluice.Decision{Rule: m.r.ID, Limit: m.r.Limit, Allowed: true}
		if m.r.FailClosed {
			d.Allowed, d.Reason = false, sluice.ReasonUnavailable
			d.RetryAfter = e.client.breakerRetry()
			st := res.add(m.r, m.key, d)
			st.FailedClosed = true
			continue
		}
		d = e.fallbackTake(ctx, m.r, tk.Limit, tk)
		if m.r.Adaptive {
			unscale(&d, m.r, res.factor)
		}
		st := res.add(m.r, m.key, d)
		st.FailedOpen = true
		if len(m.r.CountOn) > 0 && d.Allowed && !dry {
			st.charge = tk.Cost // charged after the response, as when the store answers
		}
	}
}

// fallbackTake decides a fail-open take of rule r (counted under limit l)
// in the fallback store, within the rule's degraded limit. Without a
// fallback store, or if it fails, the take is admitted.
func (e *Engine) fallbackTake(ctx context.Context, r *rule, l sluice.Limit, tk sluice.Take) sluice.Decision {
	d := sluice.Decision{Rule: r.ID, Limit: l, Allowed: true}
	if e.fallback == nil {
		return d
	}
	var out [1]sluice.Decision
	dl, n := e.degradedLimit(r, l)
	fb := [1]sluice.Take{{Rule: r.fallbackID, Key: tk.Key, Limit: dl, Cost: mulCost(tk.Cost, n), DryRun: tk.DryRun, Charge: tk.Charge}}
	if e.fallback.Take(ctx, fb[:], out[:]) == nil {
		d = out[0]
		d.Rule, d.Limit, d.Remaining = r.ID, l, d.Remaining/n
	}
	if d.Allowed && tk.Cost > 0 && !tk.DryRun && writesBack(r) {
		e.client.owed.add(r.ID, tk.Key, l, tk.Cost, time.Now())
	}
	return d
}

// writesBack reports whether what a rule admits while the store fails is
// owed to the store (see owed): for the rules whose count lives there.
func writesBack(r *rule) bool {
	switch r.Sync.Mode {
	case sluice.SyncExact, sluice.SyncLease, sluice.SyncAuto:
		return true
	}
	return false
}

// degradedLimit is how a fail-open rule counts in the fallback store while
// the store fails: under its own fallback limit if it has one (cost as
// is), else under its limit with every unit counted n times, n being the
// gateways sharing the store. Counting n units per unit under the whole
// limit admits the gateway's share, floor(L/n) at once and a rate of 1/n,
// as a limit of L/n would; but its state is the same whatever n is, so
// what the gateway admitted through the store (mirrored here) still counts
// when the number of gateways changes (a limit of L/n would start afresh
// with each new n, and admit a new share on top), and a limit below n
// gives each gateway no unit rather than one.
func (e *Engine) degradedLimit(r *rule, l sluice.Limit) (sluice.Limit, int64) {
	if r.FallbackSet {
		return r.Fallback, 1
	}
	n := 1
	if e.gateways != nil {
		n = max(e.gateways(), 1)
	}
	return l, int64(n)
}

// shadowed evaluates the shadow rules in a call of their own: they count as
// if enforced, but never decide the request.
func (e *Engine) shadowed(ctx context.Context, res *Result, mult int64, dry bool) {
	res.takes = res.takes[:0]
	res.idx = res.idx[:0]
	for i := range res.matched {
		if m := &res.matched[i]; m.r.Shadow {
			res.takes = append(res.takes, sluice.Take{Rule: m.r.ID, Key: m.key, Limit: m.r.Limit, Cost: mulCost(m.r.Cost, mult), DryRun: dry})
			res.idx = append(res.idx, i)
		}
	}
	if len(res.takes) == 0 {
		return
	}
	decs := res.decisions(len(res.takes))
	if err := e.client.call(ctx, res.takes, decs); err != nil {
		return // a shadow rule never affects the answer, not even by failing
	}
	for j, d := range decs {
		m := &res.matched[res.idx[j]]
		res.add(m.r, m.key, d).Shadow = true
	}
}

// penalize counts the rejections of penalty rules and locks the keys that
// reach their rule's After within its period. Counts and locks go to the
// store, or to the fallback store while the store fails; a lock placed in
// the store is mirrored in the fallback, so it holds if the store fails.
func (e *Engine) penalize(ctx context.Context, res *Result) {
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.r == nil || st.r.Penalty == nil || st.Shadow || st.Allowed || st.Reason != sluice.ReasonLimited {
			continue
		}
		var out [1]sluice.Decision
		count := []sluice.Take{{Rule: st.r.rejectsID, Key: st.key, Limit: st.r.rejectsLimit, Cost: 1}}
		if e.callOrFallback(ctx, count, out[:]) != nil || out[0].Remaining > 0 {
			continue
		}
		lock := []sluice.Take{{Rule: st.r.lockID, Key: st.key, Limit: st.r.lockLimit, Cost: 1}}
		if e.callOrFallback(ctx, lock, out[:]) == nil && out[0].Allowed {
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

// callOrFallback makes a store call, or, if the store fails, the same call
// on the fallback store.
func (e *Engine) callOrFallback(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	err := e.client.call(ctx, takes, out)
	if err != nil && e.fallback != nil {
		err = e.fallback.Take(ctx, takes, out)
	}
	return err
}

// Charge completes a check after the response: it charges the countOn rules
// whose status list holds status. Call it once per allowed request.
func (e *Engine) Charge(ctx context.Context, res *Result, status int) {
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.charge == 0 || !counts(st.r.CountOn, status) {
			continue
		}
		e.charge(ctx, res, st.r, sluice.Take{Rule: st.r.ID, Key: st.key, Limit: st.r.Limit, Cost: st.charge})
		st.charge = 0
	}
}

// charge makes one countOn charge: taken by the store, and mirrored into
// the share when the store admitted it; or, when the store did not take it
// in time, counted in this gateway's share, room or not (the response it
// counts was served), and owed to the store: a late reply that took it
// cancels the debt (see late.go). It reports the decision and whether the
// store failed.
func (e *Engine) charge(ctx context.Context, res *Result, r *rule, tk sluice.Take) (sluice.Decision, error) {
	r.stats.charged.Add(1)
	takes := [1]sluice.Take{tk}
	var out [1]sluice.Decision
	err := e.client.callWithDebts(ctx, r.SlowStoreWait, takes[:], out[:])
	if err == nil {
		e.follow(ctx, res, r, r.Limit, &takes[0], &out[0]) // the share knows what the store has left
		return out[0], nil
	}
	tk.Charge = true
	return e.fallbackTake(ctx, r, r.Limit, tk), err
}

func counts(statuses []int, status int) bool {
	for _, s := range statuses {
		if s == status {
			return true
		}
	}
	return false
}

// ErrNoRule is returned for a rule id the rule set does not have.
var ErrNoRule = errors.New("engine: no such rule")

// Inspect returns the state of key under rule, without consuming anything:
// an operator's view of one client, and how long a penalty lock on it has
// left (0: not locked). key is the rule's key as the engine builds it (see
// rules.Rule.AppendKey): the value itself for a one-source key.
func (e *Engine) Inspect(ctx context.Context, ruleID, key string) (sluice.Decision, time.Duration, error) {
	r := e.set.Load().find(ruleID)
	if r == nil {
		return sluice.Decision{}, 0, ErrNoRule
	}
	key = StoreKey(key)
	out := make([]sluice.Decision, 1)
	if err := e.client.call(ctx, []sluice.Take{{Rule: r.ID, Key: key, Limit: r.store}}, out); err != nil {
		return sluice.Decision{}, 0, err
	}
	if r.Adaptive {
		unscale(&out[0], r, 1)
	}
	var locked time.Duration
	if r.Penalty != nil {
		// The lock is one unit per block: taken, it comes back (ResetAfter)
		// when the lock ends.
		lk := make([]sluice.Decision, 1)
		if e.client.call(ctx, []sluice.Take{{Rule: r.lockID, Key: key, Limit: r.lockLimit}}, lk) == nil && lk[0].Remaining == 0 {
			locked = max(lk[0].ResetAfter, 1)
		}
	}
	return out[0], locked, nil
}

// Forgetter is implemented by stores that can drop one key's state, such as
// the embedded store.
type Forgetter interface {
	Forget(rule, key string) bool
}

// ErrCannotReset is returned by Reset when the store cannot drop state.
var ErrCannotReset = errors.New("engine: the store cannot reset a key")

// Reset drops key's state under rule, its penalty lock and rejection count
// and its fallback count: the key starts fresh ("unlock this user").
func (e *Engine) Reset(ruleID, key string) (bool, error) {
	r := e.set.Load().find(ruleID)
	if r == nil {
		return false, ErrNoRule
	}
	key = StoreKey(key)
	f, ok := e.client.store.(Forgetter)
	if !ok {
		return false, ErrCannotReset
	}
	found := f.Forget(r.ID, key)
	if r.Penalty != nil {
		found = f.Forget(r.lockID, key) || found
		found = f.Forget(r.rejectsID, key) || found
	}
	if fb, ok := e.fallback.(Forgetter); ok {
		fb.Forget(r.fallbackID, key)
		if r.Penalty != nil { // the mirrored lock and the counts made while the store failed
			fb.Forget(r.lockID, key)
			fb.Forget(r.rejectsID, key)
		}
	}
	return found, nil
}

func (rs *ruleSet) find(id string) *rule {
	for _, r := range rs.rules {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// ChargeStatus charges the countOn rules that req matches and whose status
// list holds status, as Charge does after a check: for callers that check
// before a response and report its status in a second call (the service's
// /v1/charge). It fills res with the charged rules' decisions.
func (e *Engine) ChargeStatus(ctx context.Context, req *rules.Request, opt CheckOptions, status int, res *Result) error {
	if opt.Cost < 0 {
		return fmt.Errorf("engine: cost must be >= 0, got %d", opt.Cost)
	}
	mult := max(opt.Cost, 1)
	rs := e.set.Load()
	res.reset(rs)
	path, ok := rs.cfg.Paths.Normalize(req.Path)
	if !ok {
		res.refuseBadRequest(rs.cfg.Paths.Why(req.Path))
		return nil // refused when it was checked: nothing to charge
	}
	res.Path, req.Path = path, rs.cfg.Paths.MatchForm(path)
	req.Method = upperMethod(req.Method)
	res.takes = res.takes[:0]
	for _, r := range rs.rules {
		if len(r.CountOn) == 0 || r.Shadow || r.Envoy != nil || !counts(r.CountOn, status) {
			continue
		}
		route, ok := r.Match.Matches(req.Method, req.Host, req.Path)
		if !ok || !r.Selects(req, route) {
			continue
		}
		start := len(res.keyBuf)
		var state rules.KeyState
		if res.keyBuf, state = ruleKey(res.keyBuf, r, req, route, rs.cfg.IPv6Prefix); state == rules.KeyFound {
			res.matched = append(res.matched, matched{r: r, start: start, end: len(res.keyBuf)})
		}
	}
	for i := range res.matched {
		m := &res.matched[i]
		m.key = view.String(res.keyBuf[m.start:m.end])
		res.takes = append(res.takes, sluice.Take{Rule: m.r.ID, Key: m.key, Limit: m.r.Limit, Cost: mulCost(m.r.Cost, mult)})
	}
	if len(res.takes) == 0 {
		return nil
	}
	// Each charge stands alone: a failed attempt counts even if another
	// rule's count is already full.
	for i := range res.takes {
		m := &res.matched[i]
		d, err := e.charge(ctx, res, m.r, res.takes[i])
		st := res.add(m.r, m.key, d)
		if err != nil {
			res.StoreError, st.FailedOpen = err, true
		}
	}
	return nil
}

// Gateways returns how many gateways share the store, as Options.Gateways
// says (1 without it).
func (e *Engine) Gateways() int {
	if e.gateways == nil {
		return 1
	}
	return max(e.gateways(), 1)
}

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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/overrides"
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
	// Overrides, if set, returns the operator's overrides in force
	// (overrides.Follower.Current): see keyoverride.go.
	Overrides func() *overrides.Set
}

// Engine evaluates requests against the current rule set. It is safe for
// concurrent use.
type Engine struct {
	client       *StoreClient      // every store call goes through it
	load         rules.LoadOptions // how reloads load several files
	fallback     sluice.Store
	gateways     func() int
	log          *slog.Logger
	set          atomic.Pointer[ruleSet]
	reloads      [2]atomic.Uint64 // ok, failed
	overrides    *envoyOverrides
	decisions    *DecisionLog
	keyOverrides keyOverrides
	onReject     func(rule, key string)
	onLock       func(rule, key string, d time.Duration)
	pressure     func() float64

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
	e.keyOverrides.source = o.Overrides
	dropper, _ := o.Store.(LimitDropper)
	e.overrides = newOverrides(o.MaxOverrides, dropper)
	e.keyOverrides.drop = dropper
	e.keyOverrides.fallback, _ = o.Fallback.(LimitDropper)
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

// match is the front half of the HTTP doors (Check, ChargeStatus): the
// request's path in normal form, then each rule that selects takes and
// that matches the request, with its key built into res.keyBuf and
// res.matched; once the buffer is complete, every key is a view of it.
//
// A key that cannot be read refuses the request, or skips the rule, as
// docs/rules.md says (onMissingKey); a charge (charging) skips every rule
// without a key, since its check answered for it. It returns false when
// the request was refused as bad.
func (e *Engine) match(rs *ruleSet, req *rules.Request, res *Result, takes func(*rule) bool, charging bool) bool {
	if req.Fragment || strings.IndexByte(req.Path, '#') >= 0 {
		res.refuseBadRequest("its request target holds a fragment (#), which clients never send and servers read in different ways")
		return false
	}
	path, ok := rs.cfg.Paths.Normalize(req.Path)
	if !ok {
		res.refuseBadRequest(rs.cfg.Paths.Why(req.Path))
		return false
	}
	res.Path, req.Path = path, rs.cfg.Paths.MatchForm(path)
	req.Method = upperMethod(req.Method)
	ov := e.keyOverrides.current()
	var now time.Time
	for _, r := range rs.rules {
		if !takes(r) {
			continue
		}
		route, ok := r.Match.Matches(req.Method, req.Host, req.Path)
		if !ok || !r.Selects(req, route) {
			continue
		}
		start := len(res.keyBuf)
		override := ""
		var state rules.KeyState
		res.keyBuf, state = ruleKey(res.keyBuf, r, req, route, rs.cfg.IPv6Prefix)
		switch {
		case state == rules.KeyFound:
			if !ov.Empty() && (ov.Has(r.ID) || r.OverrideOf != "" && ov.Has(r.OverrideOf)) {
				if now.IsZero() {
					now = time.Now()
				}
				var done bool
				if r, override, done = e.override(rs, ov, r, res, start, now); done {
					continue
				}
			}
		case charging:
			continue
		case state == rules.KeyAmbiguous && !r.Shadow:
			res.refuseBadRequest(fmt.Sprintf("the %q limit counts by a field given twice with different values, which servers read in different ways", r.ID))
			return false
		case state == rules.KeyBodyTooLarge && !r.Shadow:
			res.refuseInvalid(fmt.Sprintf("the %q limit counts by a field of its body, which is larger than the %d bytes read to find it", r.ID, rules.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return false
		case state == rules.KeyUnreadable && !r.Shadow:
			res.refuseInvalid(fmt.Sprintf("the %q limit counts by a field of its body, which is compressed, not UTF-8, or JSON or multipart that not every server reads alike", r.ID), http.StatusUnsupportedMediaType)
			return false
		case r.MissingKey == rules.MissingReject && !r.Shadow:
			res.add(r, "", sluice.Decision{Rule: r.ID, Limit: r.Limit, Reason: sluice.ReasonMissingKey})
			continue
		default: // skipped (onMissingKey: skip), or a shadow rule that could not read its key
			r.stats.skipped.Add(1)
			res.Skipped++
			res.MissingKey = append(res.MissingKey, Skip{Rule: r.ID, Limit: r.Limit})
			continue
		}
		res.matched = append(res.matched, matched{r: r, start: start, end: len(res.keyBuf), override: override})
	}
	for i := range res.matched {
		m := &res.matched[i]
		m.key = view.String(res.keyBuf[m.start:m.end])
	}
	return true
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
		e.client.call(ctx, takes[:], out[:])
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

// ErrNoRule is returned for a rule id the rule set does not have.
var ErrNoRule = errors.New("engine: no such rule")

// Gateways returns how many gateways share the store, as Options.Gateways
// says (1 without it).
func (e *Engine) Gateways() int {
	if e.gateways == nil {
		return 1
	}
	return max(e.gateways(), 1)
}

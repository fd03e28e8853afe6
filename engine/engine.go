package engine

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
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
	// Calls says how calls reach Store: their deadline, the breakers, the
	// grace for late replies, the write-back of what failed calls left
	// owed (package storecall).
	Calls storecall.Options
	// Gateways, if set, returns how many gateways share the store (the live
	// members, or a configured number). While the store fails, a fail-open
	// rule without its own fallback limit counts its share, limit/N, in the
	// Fallback store, so N degraded gateways together admit about the limit,
	// not N times it. Without it N is 1.
	Gateways func() int
	// Logger receives reload and breaker events (default slog.Default()).
	Logger *slog.Logger
	// MaxDescriptorLimits bounds the distinct descriptor limits (the limit
	// an Envoy descriptor carries) counted at once (default
	// DefaultMaxDescriptorLimits).
	MaxDescriptorLimits int
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
	store        sluice.Store
	client       *storecall.Client // every store call goes through it
	load         rules.LoadOptions // how reloads load several files
	fallback     sluice.Store
	gateways     func() int
	log          *slog.Logger
	set          atomic.Pointer[ruleSet]
	reloads      [2]atomic.Uint64 // ok, failed
	descLimits   *descriptorLimits
	decisions    *DecisionLog
	keyOverrides keyOverrides
	past         pastLimits // limits that left, whose keys carry their usage (carry.go)
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
	e := &Engine{store: o.Store, load: o.Load, fallback: o.Fallback, log: o.Logger, gateways: o.Gateways, decisions: o.DecisionLog,
		onReject: o.OnReject, onLock: o.OnLock, pressure: o.Pressure}
	e.keyOverrides.source = o.Overrides
	e.past.changed = make(chan struct{}, 1)
	dropper, _ := o.Store.(LimitDropper)
	e.descLimits = newDescriptorLimits(o.MaxDescriptorLimits, dropper)
	e.keyOverrides.drop = dropper
	e.keyOverrides.fallback, _ = o.Fallback.(LimitDropper)
	e.keyOverrides.kept = func(rule string, l sluice.Limit) bool { return e.past.holds(rule, l, time.Now()) }
	if e.log == nil {
		e.log = slog.Default()
	}
	calls := o.Calls
	if calls.Logger == nil {
		calls.Logger = e.log
	}
	e.client = storecall.New(o.Store, func(rule string) bool {
		r := e.set.Load().find(rule)
		return r != nil && writesBack(r)
	}, calls)
	e.set.Store(compile(cfg))
	return e, nil
}

// Store returns the engine's store client: the store as every call of the
// engine reaches it.
func (e *Engine) Store() *storecall.Client { return e.client }

// Config returns the rule set being served.
func (e *Engine) Config() *rules.Config { return e.set.Load().cfg }

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
	e.past.noteSet(ov, rs)
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
		var was []sluice.Limit
		res.keyBuf, state = ruleKey(res.keyBuf, r, req, route, rs.cfg.IPv6Prefix)
		switch {
		case state == rules.KeyFound:
			base := r
			overridden := !ov.Empty() && (ov.Has(r.ID) || r.KeyLimitOf != "" && ov.Has(r.KeyLimitOf))
			if overridden {
				if now.IsZero() {
					now = time.Now()
				}
				var done bool
				if r, override, done = e.override(rs, ov, r, res, start, now); done {
					continue
				}
			}
			if overridden || e.past.has(base.ID) {
				if now.IsZero() {
					now = time.Now()
				}
				was = e.wasFor(ov, base, r, view.String(res.keyBuf[start:]), now)
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
		res.matched = append(res.matched, matched{r: r, start: start, end: len(res.keyBuf), override: override, was: was})
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

package engine

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/rules"
)

// An operator's overrides (package overrides) change one rule for some
// keys at run time. match looks each matched rule's key up in the set in
// force, and then:
//
//   - exempt: the rule is passed over for the request, counting nothing;
//   - block: the request is refused (reason locked, Retry-After until the
//     override ends) and nothing is counted anywhere, as a penalty lock
//     refuses;
//   - limit: the rule is counted under a copy of itself with the
//     override's rate, period and burst, the same id, algorithm, key,
//     penalty and counters. The key keeps what it spent: its state moves
//     to the override's limit, converted, when it is next counted, and back
//     to the rule's when the override expires or is removed (carry.go).
//
// A rule without overrides costs one map lookup a request when any
// override is in force, and nothing when none is.

// AppliedOverride names an override that applied to a request.
type AppliedOverride struct {
	Rule, ID string
	Action   overrides.Action
}

// keyOverrides holds the source of the set in force and the limit
// overrides' rules, built once per rule set and override set.
//
// Stores keep state per limit (the embedded store a table per rule and
// limit), so a limit no override of the set uses any more, and that no key
// may still carry its usage from (carry.go), is dropped from the store and
// the fallback store when the derived rules are next built: an operator
// cycling through thousands of limits holds the tables of the limits in
// force and of those that left recently, not of every limit ever set. The
// rule's own limits are never dropped.
type keyOverrides struct {
	source         func() *overrides.Set
	drop, fallback LimitDropper // nil: the store keeps nothing per limit
	// kept reports whether keys may still hold state under a limit that
	// left (carry.go): its tables are not dropped yet, but wait in waiting
	// (under mu) for a later rebuild.
	kept    func(rule string, l sluice.Limit) bool
	waiting map[limitKey]bool
	mu      sync.Mutex
	derived atomic.Pointer[derivedRules]
}

type derivedRules struct {
	rs    *ruleSet
	set   *overrides.Set
	rules map[*overrides.Override]*rule
}

func (k *keyOverrides) current() *overrides.Set {
	if k.source == nil {
		return nil
	}
	return k.source()
}

// ruleFor returns base counted under limit override o.
func (k *keyOverrides) ruleFor(rs *ruleSet, set *overrides.Set, o *overrides.Override, base *rule) *rule {
	if d := k.derived.Load(); d != nil && d.rs == rs && d.set == set {
		if r := d.rules[o]; r != nil {
			return r
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	d := k.derived.Load()
	if d == nil || d.rs != rs || d.set != set {
		if d != nil {
			k.dropUnused(d, rs, set)
		}
		d = &derivedRules{rs: rs, set: set, rules: map[*overrides.Override]*rule{}}
	} else if r := d.rules[o]; r != nil {
		return r
	} else {
		d = &derivedRules{rs: rs, set: set, rules: clonedRules(d.rules)}
	}
	r, err := withLimit(base, o)
	if err != nil {
		r = base // refused when set (CheckOverride); a rule set changed since: the rule's own limit
	}
	d.rules[o] = r
	k.derived.Store(d)
	return r
}

// dropUnused frees the store state of old's limits, and of those kept
// before, that no limit override of set uses, that are not their rule's
// own in rs, and that no key may still carry its usage from (kept). A
// limit kept for its keys waits in k.waiting for a later call. The fallback
// store, which carries nothing, drops a limit at once.
func (k *keyOverrides) dropUnused(old *derivedRules, rs *ruleSet, set *overrides.Set) {
	if k.drop == nil && k.fallback == nil {
		return
	}
	inUse := map[limitKey]bool{}  // the limits of set's overrides, in both units
	for _, o := range set.All() { // expired ones too: their keys carry back (carry.go)
		if base := rs.find(o.Rule); base != nil && o.Action == overrides.Limit {
			l := base.Limit
			l.Rate, l.Period, l.Burst = o.Rate, o.Per.D(), o.Burst
			inUse[limitKey{o.Rule, l}] = true
			inUse[limitKey{o.Rule, overrideLimit(base, o)}] = true
		}
	}
	own := func(lk limitKey) bool {
		base := rs.find(lk.rule)
		return base != nil && (lk.limit == base.store || lk.limit == base.Limit || lk.limit == base.Fallback)
	}
	candidates := map[limitKey]bool{}
	for _, r := range old.rules {
		for _, l := range []sluice.Limit{r.store, r.Limit} {
			lk := limitKey{r.ID, l}
			if own(lk) || inUse[lk] || candidates[lk] {
				continue
			}
			candidates[lk] = true
			if k.fallback != nil {
				k.fallback.DropLimit(r.fallbackID, l)
			}
		}
	}
	for lk := range k.waiting {
		candidates[lk] = true
	}
	for lk := range candidates {
		switch {
		case own(lk) || inUse[lk]:
			delete(k.waiting, lk) // in force again
		case k.kept != nil && k.kept(lk.rule, lk.limit):
			if k.waiting == nil {
				k.waiting = map[limitKey]bool{}
			}
			k.waiting[lk] = true
		default:
			delete(k.waiting, lk)
			if k.drop != nil {
				k.drop.DropLimit(lk.rule, lk.limit)
			}
		}
	}
}

func clonedRules(m map[*overrides.Override]*rule) map[*overrides.Override]*rule {
	out := make(map[*overrides.Override]*rule, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// withLimit is base with o's rate, period and burst: the same id, store
// state, penalty and counters.
func withLimit(base *rule, o *overrides.Override) (*rule, error) {
	rr := *base.Rule
	l := rr.Limit
	l.Rate, l.Period, l.Burst = o.Rate, o.Per.D(), o.Burst
	if err := l.Validate(); err != nil {
		return nil, &overrides.FieldError{Field: "rate", Problem: strings.TrimPrefix(err.Error(), "invalid limit: ")}
	}
	if rr.Cost > l.Capacity() {
		return nil, &overrides.FieldError{Field: "burst", Problem: fmt.Sprintf("rule %s costs %d a request, more than a burst of %d: no request could ever pass (to refuse them all, use action block)", rr.ID, rr.Cost, l.Capacity())}
	}
	rr.Limit, rr.Fallback = l, l
	c := &rule{Rule: &rr, store: l, lockID: base.lockID, rejectsID: base.rejectsID, fallbackID: base.fallbackID,
		lockLimit: base.lockLimit, rejectsLimit: base.rejectsLimit, stats: base.stats}
	if rr.Adaptive {
		c.store = rules.AdaptiveLimit(l)
	}
	if c.store != base.store {
		c.was = []sluice.Limit{base.store}
	}
	return c, nil
}

// CheckOverride says whether o can apply to the rules in force: its rule
// exists and is one the HTTP faces decide, a prefix is for a rule keyed by
// one plain source, and a limit is one the rule can count. The error is a
// *overrides.FieldError.
func (e *Engine) CheckOverride(o *overrides.Override) error {
	r := e.set.Load().find(o.Rule)
	switch {
	case r == nil:
		return &overrides.FieldError{Field: "rule", Problem: fmt.Sprintf("no rule %q is in force", o.Rule)}
	case r.KeyLimitOf != "":
		return &overrides.FieldError{Field: "rule", Problem: fmt.Sprintf("rule %q is one of rule %s's key limits in the rule file: name %s (an operator's override of it wins over the file's key limit for the same key)", o.Rule, r.KeyLimitOf, r.KeyLimitOf)}
	case r.Envoy != nil:
		return &overrides.FieldError{Field: "rule", Problem: fmt.Sprintf("rule %q is an Envoy descriptor's: overrides apply to the HTTP faces' rules", o.Rule)}
	case o.Prefix != "" && (len(r.Key) != 1 || r.Key[0].Hash || r.Key[0].Kind == rules.FromIP):
		return &overrides.FieldError{Field: "prefix", Problem: fmt.Sprintf("rule %q is keyed by %s: a prefix needs a rule keyed by one source that is neither hashed nor an address", o.Rule, keyNames(r))}
	case o.Action == overrides.Limit:
		if _, err := withLimit(r, o); err != nil {
			return err
		}
		return e.checkDistinctLimits(o)
	}
	return nil
}

// MaxOverrideLimits bounds the distinct limits (rate, period, burst) among
// one rule's limit overrides: a store keeps a table (or a fingerprint) per
// limit of a rule, and finds it among the rule's others, so that a few
// tiers cost nothing and thousands would cost every decision of the rule.
const MaxOverrideLimits = 256

func (e *Engine) checkDistinctLimits(o *overrides.Override) error {
	type limit struct {
		rate, burst int64
		per         time.Duration
	}
	seen := map[limit]bool{{o.Rate, o.Burst, o.Per.D()}: true}
	for _, x := range e.keyOverrides.current().Live(time.Now()) {
		if x.Rule == o.Rule && x.Action == overrides.Limit && x.ID != overrides.IDOf(o.Rule, o.Key, o.Prefix) {
			seen[limit{x.Rate, x.Burst, x.Per.D()}] = true
		}
	}
	if len(seen) > MaxOverrideLimits {
		return &overrides.FieldError{Field: "rate", Problem: fmt.Sprintf("rule %s's overrides already have %d distinct limits, the most they may: give this key one of the limits in use", o.Rule, MaxOverrideLimits)}
	}
	return nil
}

func keyNames(r *rule) string {
	var b strings.Builder
	for i, k := range r.Key {
		if i > 0 {
			b.WriteString(" and ")
		}
		b.WriteString(k.Name)
	}
	return b.String()
}

// override applies the override in force for r and the key just built in
// res.keyBuf[start:], if any: it reports whether the rule is done with
// (exempt, or blocked: its status added) and otherwise the rule to count
// under, and the id of the limit override that made it.
func (e *Engine) override(rs *ruleSet, set *overrides.Set, r *rule, res *Result, start int, now time.Time) (*rule, string, bool) {
	key := view.String(res.keyBuf[start:]) // not kept
	o := set.Find(r.ID, key, now)
	if o == nil && r.KeyLimitOf != "" {
		o = set.Find(r.KeyLimitOf, key, now) // the file's override of the rule, for this key: the operator's wins
	}
	if o == nil {
		return r, "", false
	}
	res.Overrides = append(res.Overrides, AppliedOverride{Rule: r.ID, ID: o.ID, Action: o.Action})
	switch o.Action {
	case overrides.Exempt:
		res.keyBuf = res.keyBuf[:start]
		return r, "", true
	case overrides.Block:
		wait := r.Limit.Period
		if !o.UntilRemoved {
			wait = o.Expires.Sub(now)
		}
		key := string(res.keyBuf[start:])
		res.keyBuf = res.keyBuf[:start]
		if !r.Shadow {
			res.blocked = true
		}
		st := res.add(r, key, decisionLocked(r, wait))
		st.Shadow, st.Override = r.Shadow, o.ID
		return r, "", true
	}
	return e.keyOverrides.ruleFor(rs, set, o, r), o.ID, false
}

// decisionLocked is the refusal of a blocked key: a lock of wait.
func decisionLocked(r *rule, wait time.Duration) sluice.Decision {
	return sluice.Decision{Rule: r.ID, Limit: r.Limit, Reason: sluice.ReasonLocked, RetryAfter: wait, ResetAfter: wait}
}

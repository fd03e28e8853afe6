package engine

import (
	"net/http"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
)

// Result is the answer to one check. Reuse one Result per goroutine (or from
// a sync.Pool) to keep checks free of allocations.
type Result struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Reason is why: sluice.ReasonOK, or the deciding rule's reason.
	Reason sluice.Reason
	// Decision is the deciding rule's decision: when rejected, the rejecting
	// rule that asks to wait longest (a cost that can never pass comes
	// first); when allowed, the enforced rule with the least remaining;
	// between rules that answer alike, the first in the file. Its Rule is
	// "" when no enforced rule applied.
	Decision sluice.Decision
	// Delay is how long a leaky-queue rule asks the request to wait.
	Delay time.Duration
	// Statuses has every evaluated rule's decision, enforced and shadow.
	Statuses []Status
	// Overrides names the operator's overrides that applied to the
	// request (keyoverride.go), in rule order.
	Overrides []AppliedOverride
	// Skipped counts matching rules skipped because a key source was
	// missing from the request; MissingKey names them, in rule order.
	Skipped    int
	MissingKey []Skip
	// Path is the request's path in normal form (rules.PathOptions), in
	// the case it was sent: what a gateway forwards, so that what was
	// limited is what is served.
	Path string
	// Invalid says why a request refused with sluice.ReasonBadRequest
	// cannot be counted, for its answer's detail; InvalidStatus is that
	// answer's HTTP status: 400, 413 for a body too large to read its key
	// from, 415 for a body in a form that servers read in different ways.
	Invalid       string
	InvalidStatus int
	// StoreError is the store failure that the fail modes answered, if any:
	// the answer is then degraded (see Degraded).
	StoreError error
	// StoreTime is how long the check waited for a remote store (Redis):
	// its calls for the request's takes and penalty locks, the deadline
	// and breaker included. It is 0 on the embedded store, whose calls are
	// not timed (a clock read would cost more than the take).
	StoreTime time.Duration
	// Reduced reports a refusal by adaptive rules alone while they admit
	// less than their rate, the service being under pressure: it is
	// answered 503 (temporary reduced capacity), not 429.
	Reduced bool

	// Reservation names the reservations the check opened (with
	// CheckOptions.Reserve, on admitted reserve rules), to pass to Settle;
	// "" if none. ReservationDeadline is when the first of them closes at
	// its estimate.
	Reservation         string
	ReservationDeadline time.Time

	estimate int64
	reserve  bool
	priority *rules.Priority
	factor   float64 // the pressure factor, once read (factored)
	factored bool
	level    int // the request's priority tier, once known (leveled)
	leveled  bool
	hold     string   // the reservations' store id, made on first use
	nonce    [16]byte // its random bytes
	matched  []matched
	blocked  bool // an override blocks the request: nothing is counted
	keyBuf   []byte
	takes    []sluice.Take
	idx      []int
	decs     []sluice.Decision

	lockDecs   []sluice.Decision // the fallback's answers to checkLocks, reused
	mirrorTake [1]sluice.Take    // the fallback's copy of an admitted take (mirror)
	mirrorOut  [1]sluice.Decision
}

// Degraded reports whether the store failed and the enforced rules were
// answered by their fail modes: fail-open rules from their per-node share,
// fail-closed rules with a refusal.
func (res *Result) Degraded() bool { return res.StoreError != nil }

// Status is one rule's part in a result.
type Status struct {
	sluice.Decision
	// Shadow rules are reported, never enforced.
	Shadow bool
	// FailedOpen: the store failed and the rule let the request through
	// under its per-node fallback limit; FailedClosed: it rejected.
	FailedOpen, FailedClosed bool
	// Unlimited marks an Envoy descriptor whose limit is unlimited: always
	// allowed, nothing counted.
	Unlimited bool
	// Tier is the request's priority tier (an index into the priority
	// section's levels, 0 the highest) for a rule with tiers; 0 otherwise.
	Tier int
	// Reduced marks a refusal by an adaptive rule admitting less than its
	// rate (its Limit is then the reduced one).
	Reduced bool
	// Override is the id of the operator's override that counted or
	// refused the key, if one did.
	Override string

	r      *rule
	key    string
	charge int64 // units a countOn rule will charge after the response
	taken  int64 // units the check took, which Refund gives back
	hold   bool  // the take opened a reservation
}

// Key returns the key the rule counted the request under (a copy: the
// result's buffers are reused by the next check). Hashed key sources appear
// as their digest.
func (st *Status) Key() string { return strings.Clone(st.key) }

// Charging reports whether the rule will be charged after the response
// (a countOn rule): the caller must then call Engine.Charge.
func (st *Status) Charging() bool { return st.charge > 0 }

// Charges reports whether a countOn rule will be charged after the
// response: the caller must then call Engine.Charge with its status.
func (res *Result) Charges() bool {
	for i := range res.Statuses {
		if res.Statuses[i].Charging() {
			return true
		}
	}
	return false
}

// RuleDef returns the rule's definition (nil for a status the engine made
// without one).
func (st *Status) RuleDef() *rules.Rule {
	if st.r == nil {
		return nil
	}
	return st.r.Rule
}

type matched struct {
	r          *rule
	start, end int
	key        string
	override   string // the id of the limit override it counts under
	// was lists the limits the key may have been counted under before
	// (sluice.Take.Was, in the store's units): see carry.go.
	was []sluice.Limit
}

// wasOf is m.was for a take under l: none unless l is the store's limit
// (an adaptive rule's takes in the rule's own units have no history).
func (m *matched) wasOf(l sluice.Limit) []sluice.Limit {
	if l != m.r.store {
		return nil
	}
	return m.was
}

// Skip is a rule that matched a request but did not apply to it, because
// the request lacks a source of the rule's key (and the rule skips such
// requests, the default): it counted nothing and decided nothing.
type Skip struct {
	Rule  string
	Limit sluice.Limit
}

// refuseBadRequest refuses a request that cannot be counted as its
// upstream would read it, saying why; nothing is counted.
func (res *Result) refuseBadRequest(why string) {
	res.refuseInvalid(why, http.StatusBadRequest)
}

// refuseInvalid refuses a request that cannot be counted with status.
func (res *Result) refuseInvalid(why string, status int) {
	res.Allowed, res.Reason, res.Invalid, res.InvalidStatus = false, sluice.ReasonBadRequest, why, status
	res.Decision = sluice.Decision{Reason: sluice.ReasonBadRequest}
	clear(res.Statuses)
	res.Statuses = res.Statuses[:0]
}

func (res *Result) reset(rs *ruleSet) {
	res.Allowed, res.Reason, res.Decision, res.Delay, res.Invalid, res.InvalidStatus, res.Path = true, sluice.ReasonOK, sluice.Decision{}, 0, "", 0, ""
	res.Skipped, res.StoreError, res.StoreTime = 0, nil, 0
	res.Reservation, res.ReservationDeadline, res.hold = "", time.Time{}, ""
	res.priority, res.leveled, res.level = rs.cfg.Priority, false, 0
	res.factored, res.Reduced = false, false
	res.MissingKey = res.MissingKey[:0]
	res.Overrides, res.blocked = res.Overrides[:0], false
	clear(res.Statuses) // drop references to keys and rules of the last check
	res.Statuses = res.Statuses[:0]
	res.matched = res.matched[:0]
	res.keyBuf = res.keyBuf[:0]
}

func (res *Result) add(r *rule, key string, d sluice.Decision) *Status {
	if r != nil && r.DelayAfter > 0 && d.Delay > 0 {
		d.Delay = undelayed(r, d)
	}
	res.Statuses = append(res.Statuses, Status{Decision: d, r: r, key: key})
	return &res.Statuses[len(res.Statuses)-1]
}

// undelayed is a leaky-queue decision's delay with the rule's first
// DelayAfter requests beyond the rate let through at once (nginx's
// limit_req delay=): the queue's state and what it admits are unchanged,
// and each delay is shortened by DelayAfter intervals, never below 0. An
// adaptive rule's decision is in scaled units: its interval is the rule's.
func undelayed(r *rule, d sluice.Decision) time.Duration {
	interval := d.Limit.Interval()
	if r.Adaptive {
		interval = r.Limit.Interval()
	}
	return max(0, d.Delay-time.Duration(r.DelayAfter)*interval)
}

// combine sets the overall answer from the enforced statuses.
func (res *Result) combine() {
	var decider *Status
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Shadow || st.r == nil {
			continue // shadow rules never decide; a descriptor with no limit neither
		}
		if !st.Allowed {
			if res.Allowed || rejectsHarder(st, decider) {
				decider = st
			}
			res.Allowed = false
			continue
		}
		res.Delay = max(res.Delay, st.Delay)
		if res.Allowed && (decider == nil || st.Remaining < decider.Remaining) {
			decider = st
		}
	}
	if decider != nil {
		res.Decision = decider.Decision
		res.Reason = decider.Reason
	}
	if !res.Allowed {
		res.Reduced = true
		for i := range res.Statuses {
			if st := &res.Statuses[i]; !st.Shadow && st.r != nil && !st.Allowed && !st.Reduced {
				res.Reduced = false // refused for the client's own use too
			}
		}
	}
	if !res.Allowed {
		res.Delay = 0
	}
}

// rejectsHarder orders rejections: a cost that can never pass, then the
// longest wait.
func rejectsHarder(a, b *Status) bool {
	if (a.Reason == sluice.ReasonTooLarge) != (b.Reason == sluice.ReasonTooLarge) {
		return a.Reason == sluice.ReasonTooLarge
	}
	return a.RetryAfter > b.RetryAfter
}

// count adds the status to its rule's counts. admitted is the request's
// outcome: an enforced rule that had room counts as allowed only if the
// request passed; if another rule refused it, nothing was charged and the
// rule was overruled.
func (st *Status) count(admitted bool) {
	if st.r == nil {
		return
	}
	c := st.r.stats
	if st.r.Tiers != nil && !st.Shadow && !st.FailedOpen && !st.FailedClosed {
		switch {
		case st.Allowed && admitted:
			c.tierAllowed[st.Tier].Add(1)
		case !st.Allowed:
			c.tierLimited[st.Tier].Add(1)
		}
	}
	switch {
	case st.FailedOpen:
		c.failedOpen.Add(1)
	case st.FailedClosed:
		c.failedClosed.Add(1)
	case st.Shadow && !st.Allowed:
		c.shadowLimited.Add(1)
	case st.Allowed && !st.Shadow && !admitted:
		c.overruled.Add(1)
	case st.Allowed:
		c.allowed.Add(1)
		if !st.Shadow && st.Remaining*10 <= st.Limit.Capacity() {
			c.nearLimit.Add(1) // within 10% of the burst
		}
	default:
		c.limited.Add(1)
	}
}

// RuleStats are one rule's counts since the engine started (or since the
// rule was last changed by a reload).
type RuleStats struct {
	Rule                                                                                string
	Shadow                                                                              bool
	Allowed, Limited, ShadowLimited, FailedOpen, FailedClosed, Skipped, Locked, Charged uint64
	// FellBack counts requests counted under the fallback key, their own
	// key missing (onMissingKey: fallback).
	FellBack uint64
	// Overruled counts requests another rule refused while this one had
	// room: nothing was charged, and they are not counted as allowed.
	Overruled uint64
	// NearLimit counts allowed requests that left the key within 10% of its
	// burst.
	NearLimit uint64
	// Settled counts reservations settled; Unsettled settles that found no
	// reservation (settled already, or past the deadline: then the
	// estimate stood).
	Settled, Unsettled uint64
	// Tiers counts, for a rule with tiers, each tier's admitted and
	// refused requests, highest tier first.
	Tiers []TierStats
}

// Idle reports whether the rule has counted nothing since it was loaded.
func (s RuleStats) Idle() bool {
	return s.Allowed|s.Limited|s.ShadowLimited|s.FailedOpen|s.FailedClosed|s.Skipped|s.Locked|s.Charged|
		s.FellBack|s.Overruled|s.NearLimit|s.Settled|s.Unsettled == 0
}

// TierStats are one priority tier's counts under one rule.
type TierStats struct {
	Tier             string
	Allowed, Limited uint64
}

// Stats returns the counts of every rule being served.
func (e *Engine) Stats() []RuleStats {
	rs := e.set.Load()
	out := make([]RuleStats, len(rs.rules))
	for i, r := range rs.rules {
		c := r.stats
		out[i] = RuleStats{
			Rule: r.ID, Shadow: r.Shadow,
			Allowed: c.allowed.Load(), Limited: c.limited.Load(), ShadowLimited: c.shadowLimited.Load(),
			FailedOpen: c.failedOpen.Load(), FailedClosed: c.failedClosed.Load(), Skipped: c.skipped.Load(), FellBack: c.fellBack.Load(),
			Locked: c.locked.Load(), Charged: c.charged.Load(), NearLimit: c.nearLimit.Load(), Overruled: c.overruled.Load(),
			Settled: c.settled.Load(), Unsettled: c.unsettled.Load(),
		}
		if r.Tiers != nil && rs.cfg.Priority != nil {
			for level, name := range rs.cfg.Priority.Levels {
				out[i].Tiers = append(out[i].Tiers, TierStats{Tier: name, Allowed: c.tierAllowed[level].Load(), Limited: c.tierLimited[level].Load()})
			}
		}
	}
	return out
}

// Tier returns the request's priority tier (an index into the priority
// section's levels, 0 the highest), or 0 without a priority section: for
// a concurrency limit with tiers (concurrency.Limiter.AcquireAt).
func (res *Result) Tier() int { return res.level }

// Adaptive reports whether an enforced rule marked adaptive applies to the
// request: its outcome is a sample of the pressure those rules follow
// (concurrency.Pressure), and the outcome of any other request is not.
func (res *Result) Adaptive() bool {
	for i := range res.Statuses {
		if st := &res.Statuses[i]; !st.Shadow && st.r != nil && st.r.Adaptive {
			return true
		}
	}
	return false
}

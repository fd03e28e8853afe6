package engine

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/rules"
)

// A key keeps what it spent when its limit changes: an operator's override
// set, changed, expired or removed, a rule file reloaded with another limit,
// an xDS update of a descriptor's. Stores keep a key's state per limit, so
// each take names the limits the key may have been counted under before
// (sluice.Take.Was), and the store moves the state from the first of them
// that holds it, converted (algo's Carry), when the key is next counted.
//
// The limits a key may have had are, for a key of rule r:
//
//   - r's own limit, when the key is counted under an override;
//   - the limit of every override of r for the key (its own or a prefix's)
//     still in the override set, in force or expired;
//   - the limits of overrides of the key that left the set, and r's limits
//     before a reload, each for as long as a key counted under it can hold
//     state (pastLimits): a bucket's refill time, two windows;
//   - on a store several processes share, the limits the others count r's
//     keys under or did lately (FollowLimits): a process that started after
//     a change, or reloads later than another, still carries.
//
// A rule that never changed and has no overrides names none, and its takes
// cost nothing more.

// pastLimits remembers the limits that left: overrides gone from the set,
// a rule's limits before a reload. Bounded by maxPast entries; past them
// the oldest are forgotten (their keys then start afresh under the limit
// they move to).
type pastLimits struct {
	mu   sync.Mutex
	set  atomic.Pointer[overrides.Set] // the override set last noted
	view atomic.Pointer[pastView]      // nil: nothing has left
	// shared are the limits other processes on the store count the rules'
	// keys under, or did lately (FollowLimits); every key of the rule.
	shared atomic.Pointer[pastView]
	// changed wakes FollowLimits at once when the rules or the overrides
	// change, so the others learn the limits before their next round.
	changed chan struct{}
	// following says FollowLimits runs; known, that its last round read the
	// others' limits (Engine.LimitsKnown).
	following, known atomic.Bool
}

// maxPast bounds the limits remembered, over all rules and keys;
// maxPastLimits the distinct limits remembered for one rule, whose tables
// the embedded store keeps (the most recent of them).
const (
	maxPast       = 100_000
	maxPastLimits = 64
)

type pastView map[string]*rulePast // by rule id

type rulePast struct {
	all      []pastLimit            // the rule's own earlier limits: every key
	exact    map[string][]pastLimit // overrides of one key
	prefixes map[string][]pastLimit // overrides of a prefix
	lengths  []int                  // of prefixes
}

type pastLimit struct {
	limit sluice.Limit // in the store's units (an adaptive rule's scale)
	until time.Time    // past it no key holds state under it
}

// horizon is how long a key counted under l may hold state after its last
// take: a bucket's time to refill from empty, two windows (the sliding
// window counter's), and a second.
func horizon(l sluice.Limit) time.Duration {
	p, err := algo.NewParams(l)
	if err != nil {
		return 0
	}
	return time.Duration(max(p.D, 2*p.W)) + time.Second
}

// overrideLimit is the limit base is counted under for the keys of limit
// override o, in the store's units.
func overrideLimit(base *rule, o *overrides.Override) sluice.Limit {
	l := base.Limit
	l.Rate, l.Period, l.Burst = o.Rate, o.Per.D(), o.Burst
	if base.Adaptive {
		return rules.AdaptiveLimit(l)
	}
	return l
}

// noteSet records the limit overrides of the set last noted that set
// leaves (removed, dropped once expired, or changed to another limit).
func (p *pastLimits) noteSet(set *overrides.Set, rs *ruleSet) {
	old := p.set.Load()
	if old == set {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old = p.set.Load(); old == set {
		return
	}
	type id struct{ rule, key, prefix string }
	next := map[id]*overrides.Override{}
	for _, o := range set.All() {
		next[id{o.Rule, o.Key, o.Prefix}] = o
	}
	now := time.Now()
	var left []pastEntry
	for _, o := range old.All() {
		base := rs.find(o.Rule)
		if o.Action != overrides.Limit || base == nil {
			continue
		}
		l := overrideLimit(base, o)
		if n := next[id{o.Rule, o.Key, o.Prefix}]; n != nil && n.Action == overrides.Limit && overrideLimit(base, n) == l {
			continue
		}
		until := now
		if !o.UntilRemoved && o.Expires.Before(now) {
			until = o.Expires
		}
		left = append(left, pastEntry{o.Rule, o.Key, o.Prefix, pastLimit{l, until.Add(horizon(l))}})
	}
	p.add(left, now)
	p.set.Store(set)
}

// noteReload records the limits of prev's rules that next changes.
func (p *pastLimits) noteReload(prev, next *ruleSet) {
	now := time.Now()
	var left []pastEntry
	for _, r := range next.rules {
		if old := prev.find(r.ID); old != nil && old.store != r.store {
			left = append(left, pastEntry{rule: r.ID, past: pastLimit{old.store, now.Add(horizon(old.store))}})
		}
	}
	if len(left) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.add(left, now)
}

// pastEntry is a limit that left, for one key (key), the keys of a prefix
// (prefix), or every key of its rule (neither).
type pastEntry struct {
	rule, key, prefix string
	past              pastLimit
}

// add rebuilds the view with entries and without what has expired at now;
// under mu.
func (p *pastLimits) add(entries []pastEntry, now time.Time) {
	var all []pastEntry
	if v := p.view.Load(); v != nil {
		for id, rp := range *v {
			keep := func(key, prefix string, ls []pastLimit) {
				for _, l := range ls {
					if l.until.After(now) {
						all = append(all, pastEntry{id, key, prefix, l})
					}
				}
			}
			keep("", "", rp.all)
			for k, ls := range rp.exact {
				keep(k, "", ls)
			}
			for pre, ls := range rp.prefixes {
				keep("", pre, ls)
			}
		}
	}
	all = append(all, entries...)
	// The most recent first: past the bounds, the oldest are forgotten.
	slices.SortStableFunc(all, func(a, b pastEntry) int { return b.past.until.Compare(a.past.until) })
	all = all[:min(len(all), maxPast)]
	type ruleLimit struct {
		rule  string
		limit sluice.Limit
	}
	distinct, perRule := map[ruleLimit]bool{}, map[string]int{}
	kept := all[:0]
	for _, e := range all {
		rl := ruleLimit{e.rule, e.past.limit}
		if !distinct[rl] {
			if perRule[e.rule] == maxPastLimits {
				continue
			}
			distinct[rl] = true
			perRule[e.rule]++
		}
		kept = append(kept, e)
	}
	all = kept
	if len(all) == 0 {
		p.view.Store(nil)
		return
	}
	v := pastView{}
	for _, e := range all {
		rp := v[e.rule]
		if rp == nil {
			rp = &rulePast{exact: map[string][]pastLimit{}, prefixes: map[string][]pastLimit{}}
			v[e.rule] = rp
		}
		switch {
		case e.key != "":
			rp.exact[e.key] = append(rp.exact[e.key], e.past)
		case e.prefix != "":
			if _, ok := rp.prefixes[e.prefix]; !ok && !slices.Contains(rp.lengths, len(e.prefix)) {
				rp.lengths = append(rp.lengths, len(e.prefix))
			}
			rp.prefixes[e.prefix] = append(rp.prefixes[e.prefix], e.past)
		default:
			rp.all = append(rp.all, e.past)
		}
	}
	p.view.Store(&v)
}

// has reports whether any limit of rule has left.
func (p *pastLimits) has(rule string) bool {
	for _, v := range [2]*pastView{p.view.Load(), p.shared.Load()} {
		if v != nil && (*v)[rule] != nil {
			return true
		}
	}
	return false
}

// holds reports whether l is a limit of rule that left and that keys may
// still hold state under at now: its store state must not be dropped.
func (p *pastLimits) holds(rule string, l sluice.Limit, now time.Time) bool {
	if s := p.shared.Load(); s != nil && (*s)[rule] != nil {
		for _, x := range (*s)[rule].all {
			if x.limit == l && x.until.After(now) {
				return true
			}
		}
	}
	v := p.view.Load()
	if v == nil || (*v)[rule] == nil {
		return false
	}
	rp := (*v)[rule]
	found := false
	each := func(ls []pastLimit) {
		for _, x := range ls {
			found = found || x.limit == l && x.until.After(now)
		}
	}
	each(rp.all)
	for _, ls := range rp.exact {
		each(ls)
	}
	for _, ls := range rp.prefixes {
		each(ls)
	}
	return found
}

// each calls fn with the limits of rule that left and may still hold key's
// state at now.
func (p *pastLimits) each(rule, key string, now time.Time, fn func(sluice.Limit)) {
	emit := func(ls []pastLimit) {
		for _, l := range ls {
			if l.until.After(now) {
				fn(l.limit)
			}
		}
	}
	if s := p.shared.Load(); s != nil && (*s)[rule] != nil {
		emit((*s)[rule].all)
	}
	v := p.view.Load()
	if v == nil {
		return
	}
	rp := (*v)[rule]
	if rp == nil {
		return
	}
	emit(rp.all)
	emit(rp.exact[key])
	for _, n := range rp.lengths {
		if n <= len(key) {
			emit(rp.prefixes[key[:n]])
		}
	}
}

// wasFor returns the limits key may have been counted under before being
// counted under counted (base itself, or one of its limit overrides), for
// sluice.Take.Was; nil when there are none. set is the override set in
// force.
func (e *Engine) wasFor(set *overrides.Set, base, counted *rule, key string, now time.Time) []sluice.Limit {
	past := e.past.has(base.ID)
	others := set.AnyEnded(now) || set.HasPrefixes(base.ID) // overrides of the key other than the one in force
	switch {
	case counted == base && !past && !set.AnyEnded(now):
		return nil // no override of the key is out of force: it was never counted elsewhere
	case counted != base && !past && !others:
		return counted.was // the rule's own limit, and nothing else (shared, never modified)
	}
	var was []sluice.Limit
	add := func(l sluice.Limit) {
		if l != counted.store && !slices.Contains(was, l) {
			was = append(was, l)
		}
	}
	if counted != base {
		add(base.store)
	}
	if set.Has(base.ID) {
		set.Matching(base.ID, key, func(o *overrides.Override) {
			if o.Action == overrides.Limit {
				add(overrideLimit(base, o))
			}
		})
	}
	e.past.each(base.ID, key, now, add)
	return was
}

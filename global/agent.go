package global

import (
	"sort"
	"sync"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// Part is a region's part of one key, as the region's store holds it.
type Part struct {
	Key          string
	Held, Own    int64 // thousandths
	Until        int64 // a lease's end, microseconds on the region store's clock; 0: none
	Asked, Short int64 // units asked and refused since the part began
}

// Set is a key's new share in a region: above the region's own until Until
// (microseconds on the region store's clock).
type Set struct {
	Key   string
	Share int64
	Until int64
}

// Rule is a global rule as the agent exchanges for it.
type Rule struct {
	ID      string
	Limit   sluice.Limit
	Options Options
}

// Agent is a region's side of the exchanges of its shares of the global
// rules: every Period, or a quarter period after the region was short of
// share or gave some up, it plans an exchange from the parts its store
// holds (Plan), and takes the coordinator's answer (Answer).
type Agent struct {
	Region string // the region's name

	mu    sync.Mutex
	rules map[string]*ruleState
}

// ruleState is what the agent keeps between ticks for one rule.
type ruleState struct {
	last    int64 // the last exchange, region µs
	confirm bool  // a grant shrank a share: say so at once
	keys    map[string]*keyState
	others  []string // keys other regions want more of
}

type keyState struct {
	samples   [5]sample // asked, a tick apart: a period and a tick
	n         int
	wanted    bool  // others want more of it (the last answer)
	seen      int64 // when it was last asked for, region µs
	short     int64 // units refused, at the last tick
	prevShort int64 // and at the tick before
}

type sample struct{ at, asked int64 }

// Tick is the agent's step for a rule: a quarter of its period.
func (o Options) Tick() time.Duration { return max(o.Period/4, time.Millisecond) }

// Plan decides, at now (region µs), whether the rule's exchange is due, and
// with what: each key's share after what the region gives up (release, to
// apply before the request is sent) and the share it would use. A key is
// asked about while the region asked for it lately, holds other than its
// own share, or others want more of it.
func (a *Agent) Plan(r *Rule, o *Options, now int64, parts []Part) (asks []Ask, release []Set, due bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rules == nil {
		a.rules = map[string]*ruleState{}
	}
	rs := a.rules[r.ID]
	if rs == nil {
		rs = &ruleState{keys: map[string]*keyState{}}
		a.rules[r.ID] = rs
	}
	own := o.Own[a.Region]
	period, tick := o.Period.Microseconds(), o.Tick().Microseconds()
	rate := float64(r.Limit.Rate) / r.Limit.Period.Seconds()
	short := false
	seen := map[string]bool{}
	others := map[string]bool{}
	for _, k := range rs.others {
		others[k] = true
	}
	for _, p := range parts {
		seen[p.Key] = true
		ks := rs.keys[p.Key]
		if ks == nil {
			ks = &keyState{}
			rs.keys[p.Key] = ks
		}
		if ks.n > 0 {
			prev := ks.samples[(ks.n-1)%len(ks.samples)]
			if p.Asked != prev.asked {
				ks.seen = now
			}
			ks.prevShort = ks.short
		} else if p.Asked > 0 {
			ks.seen = now
		}
		if p.Short > ks.short {
			short = true
		}
		ks.samples[ks.n%len(ks.samples)] = sample{at: now, asked: p.Asked}
		ks.short = p.Short
		ks.n++
		held := heldAt(p, now)
		active := now-ks.seen <= 2*period || held != own || ks.wanted || others[p.Key]
		if !active {
			continue
		}
		want := Want(ks.rate(now, period), rate, o.Capacity())
		switch {
		case ks.n == 1 && p.Short > 0:
			// Refused before its demand could be measured (one sample):
			// ask for all of it; fairness among the regions that want more
			// than there is divides it, and the next tick measures.
			want = o.Capacity()
		case ks.n > 1 && p.Short > ks.prevShort:
			// Refused for want of share: the estimate lags a demand that
			// grows, so ask for twice what it holds at least.
			want = max(want, min(o.Capacity(), 2*held+algo.Whole/10))
		}
		keep := held
		if want < held && ks.wanted {
			// What it does not need goes when others want it, and only
			// then: a lull in its traffic is not a move of its demand.
			keep = want
		}
		if keep < held {
			release = append(release, Set{Key: p.Key, Share: keep})
		}
		asks = append(asks, Ask{Key: p.Key, Held: keep, Want: want})
	}
	for _, k := range rs.others { // wanted elsewhere, never asked for here: held at the own share
		if !seen[k] {
			seen[k] = true
			asks = append(asks, Ask{Key: k, Held: own, Want: 0})
		}
	}
	sort.Slice(asks, func(i, j int) bool { return asks[i].Key < asks[j].Key })
	for k, ks := range rs.keys { // forget keys gone from the store
		if !seen[k] && now-ks.seen > 4*period {
			delete(rs.keys, k)
		}
	}
	since := now - rs.last
	switch {
	case rs.last == 0, since >= period, rs.confirm:
		due = true
	case (short || len(release) > 0) && since >= tick:
		due = true
	}
	if due {
		rs.last, rs.confirm = now, false
	}
	return asks, release, due
}

// Answer takes the coordinator's grants for an exchange sent at sent
// (region µs): the sets to apply, a lease ending LeaseFor after sent.
func (a *Agent) Answer(r *Rule, o *Options, sent int64, asks []Ask, grants []Grant, wanted []string) []Set {
	a.mu.Lock()
	defer a.mu.Unlock()
	rs := a.rules[r.ID]
	if rs == nil {
		return nil
	}
	own := o.Own[a.Region]
	held, want := map[string]int64{}, map[string]int64{}
	for _, k := range asks {
		held[k.Key], want[k.Key] = k.Held, k.Want
	}
	var sets []Set
	for _, g := range grants {
		if ks := rs.keys[g.Key]; ks != nil {
			ks.wanted = g.Wanted
		} else if g.Wanted {
			rs.keys[g.Key] = &keyState{wanted: true}
		}
		if g.Share < held[g.Key] || g.Wanted && g.Share > want[g.Key] {
			// Shrunk (the coordinator counts the old share until told), or
			// holding more than it uses while others want it: at once.
			rs.confirm = true
		}
		if g.Share == held[g.Key] && g.Share <= own {
			continue
		}
		s := Set{Key: g.Key, Share: g.Share}
		if g.Share > own {
			s.Until = sent + o.LeaseFor.Microseconds()
		}
		sets = append(sets, s)
	}
	for _, k := range wanted {
		// Others want keys it never asked about, so never used of late:
		// given up at once, said at the next tick.
		if _, asked := held[k]; !asked && own > 0 {
			sets = append(sets, Set{Key: k, Share: 0})
			rs.confirm = true
		}
	}
	rs.others = wanted
	return sets
}

// Confirming reports whether the rule's next exchange is due at once: a
// grant shrank a share, and the coordinator counts the old one until told.
func (a *Agent) Confirming(rule string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	rs := a.rules[rule]
	return rs != nil && rs.confirm
}

// heldAt is a part's share in force at now.
func heldAt(p Part, now int64) int64 {
	if p.Held > p.Own && p.Until != 0 && now >= p.Until {
		return p.Own
	}
	return p.Held
}

// rate is the units a second asked over the last window µs.
func (ks *keyState) rate(now, window int64) float64 {
	if ks.n < 2 {
		return 0
	}
	newest := ks.samples[(ks.n-1)%len(ks.samples)]
	oldest := newest
	for i := 2; i <= min(ks.n, len(ks.samples)); i++ {
		s := ks.samples[(ks.n-i)%len(ks.samples)]
		oldest = s
		if now-s.at >= window {
			break
		}
	}
	span := newest.at - oldest.at
	if span <= 0 || newest.asked < oldest.asked {
		return 0
	}
	return float64(newest.asked-oldest.asked) / (float64(span) / 1e6)
}

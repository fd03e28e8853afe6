package rules

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
)

// Summary describes the rule in one line, for `sluice check`: what it
// matches, its key, and its limit in words.
func (r *Rule) Summary() string { return r.SummaryIn("") }

// SummaryIn is Summary as a gateway of region describes the rule: a rule
// with regions names the share that gateway enforces.
func (r *Rule) SummaryIn(region string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", r.ID)
	if r.Shadow {
		b.WriteString("[shadow] ")
	}
	if r.Envoy != nil {
		b.WriteString("envoy domain ")
		b.WriteString(r.Envoy.Domain)
		for _, e := range r.Envoy.Entries {
			b.WriteString(" " + e.Key + "=")
			if e.Value == "" {
				b.WriteString("(each value)")
			} else {
				b.WriteString(e.Value)
			}
		}
	} else {
		b.WriteString(r.Match.String())
		if len(r.Exempt) > 0 {
			b.WriteString(" except ")
			b.WriteString(valueSetsWords(r.Exempt, " or "))
		}
		b.WriteString(", per ")
		b.WriteString(keyNames(r.Key))
		b.WriteString(missingWords(r))
	}
	b.WriteString(": ")
	if r.Envoy != nil && r.Envoy.Unlimited {
		b.WriteString("unlimited")
	} else {
		b.WriteString(Ceiling(r.Limit))
	}
	if r.Cost != 1 {
		fmt.Fprintf(&b, "; each request costs %d", r.Cost)
	}
	if len(r.CountOn) > 0 {
		fmt.Fprintf(&b, "; only responses %v count", r.CountOn)
	}
	if len(r.Tiers) > 0 {
		b.WriteString("; tiers: ")
		b.WriteString(r.tierWords())
	}
	if r.Adaptive {
		b.WriteString("; adaptive: admits less while the protected service is under pressure")
	}
	if rv := r.Reserve; rv != nil {
		fmt.Fprintf(&b, "; reserves %d up front and settles at the real cost", rv.Estimate)
		switch {
		case rv.ActualHeader != "":
			fmt.Fprintf(&b, " (response header %s)", rv.ActualHeader)
		case rv.ActualJSON != nil:
			fmt.Fprintf(&b, " (response field %s)", strings.Join(rv.ActualJSON, "."))
		}
		fmt.Fprintf(&b, " within %s", amountWords(rv.Deadline))
	}
	if r.Penalty != nil {
		fmt.Fprintf(&b, "; locked for %s after %d rejections", amountWords(r.Penalty.Block), r.Penalty.After)
	}
	if r.DelayAfter > 0 {
		fmt.Fprintf(&b, "; the first %d beyond the rate pass at once, the rest wait their turn", r.DelayAfter)
	}
	if r.RefusalStatus == http.StatusServiceUnavailable {
		b.WriteString("; refused with 503")
	}
	if r.FailClosed {
		b.WriteString("; fails closed")
	}
	if r.SlowStoreWait > 0 {
		fmt.Fprintf(&b, "; waits up to %s for a slow store", amountWords(r.SlowStoreWait))
	}
	if sh := r.Sync; sh.Mode != sluice.SyncExact || sh.Shards > 1 {
		fmt.Fprintf(&b, "; shared by %s", SharingBound(sh, r.Limit))
	}
	if len(r.Regions) > 0 {
		b.WriteString("; regions ")
		b.WriteString(r.regionWords(region))
	}
	if g := r.Global; g != nil {
		b.WriteString("; global across ")
		b.WriteString(g.words(region))
	}
	fmt.Fprintf(&b, " (%s)", r.Limit.Algorithm)
	return b.String()
}

// words names the regions' own shares, this region's first, and the
// borrowing allowed.
func (g *Global) words(region string) string {
	names := make([]string, 0, len(g.Own))
	for n := range g.Own {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		p := fmt.Sprintf("%s %g%%", n, float64(g.Own[n])/10)
		if n == region {
			p += " (here)"
		}
		parts = append(parts, p)
	}
	out := strings.Join(parts, ", ") + " of it, moved to where demand is every " + g.Period.String()
	if g.Borrow > 0 {
		out += fmt.Sprintf(", borrowing up to %g%%", float64(g.Borrow)/10)
	}
	return out
}

// tierWords says what each priority tier keeps of the limit, and what the
// lowest may use.
func (r *Rule) tierWords() string {
	name := func(i int) string {
		if i < len(r.levels) {
			return r.levels[i]
		}
		return fmt.Sprintf("level %d", i)
	}
	lowest := len(r.Tiers)
	if len(r.levels) > 0 {
		lowest = len(r.levels) - 1
	}
	var kept []string
	above := 0.0 // the shares the lowest tier may not take
	for i, x := range r.Tiers {
		if x > 0 {
			if i < lowest {
				above += x
			}
			if i == 0 {
				kept = append(kept, fmt.Sprintf("%.4g%% for %s", x*100, name(i)))
			} else {
				kept = append(kept, fmt.Sprintf("%.4g%% for %s and above", x*100, name(i)))
			}
		}
	}
	if len(kept) == 0 {
		return "none kept for any tier"
	}
	return fmt.Sprintf("keeps %s (%s may use %.4g%%)", strings.Join(kept, ", "), name(lowest), 100-above*100)
}

// regionWords names each region's share, and the limit a gateway of
// region enforces.
func (r *Rule) regionWords(region string) string {
	names := make([]string, 0, len(r.Regions))
	for n := range r.Regions {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.4g%%", n, r.Regions[n]*100)
	}
	s := strings.Join(parts, ", ")
	if f, ok := r.Regions[region]; ok {
		s += fmt.Sprintf(": this gateway (%s) enforces %s", region, Ceiling(r.Limit.Part(f)))
	}
	return s
}

// SharingBound says in words how a rule is shared among gateways and what
// that costs in exactness.
func SharingBound(sh sluice.Sharing, l sluice.Limit) string {
	sh = sh.WithDefaults()
	var s string
	switch sh.Mode {
	case sluice.SyncExact:
		s = "exact (one atomic store call per decision)"
	case sluice.SyncLease:
		s = fmt.Sprintf("lease (batches of up to %d units, returned after %s; never over the limit, under it by at most the units out on leases)", sh.Batch, sh.Interval)
	case sluice.SyncPeriodic:
		s = fmt.Sprintf("sync (local counts flushed every %s; may pass the limit by about rate x %s x (gateways - 1) in steady traffic, and in a flood by up to what each gateway admits between flushes, up to the limit on each: 1,867 of 1,000 measured with 3 gateways)", sh.Interval, sh.Interval)
	case sluice.SyncSplit:
		s = "split (limit / live gateways on each, no store call; exact only if traffic is balanced and the gateway count right)"
	case sluice.SyncLocal:
		s = "local (each gateway's own count: up to gateways x the limit in all)"
	case sluice.SyncAuto:
		s = fmt.Sprintf("auto (lease for keys above %d decisions/s, exact for the rest)", sh.HotAbove)
	}
	if sh.Shards > 1 {
		s += fmt.Sprintf(", each key split in %d shards of %s", sh.Shards, Ceiling(ShardLimit(l, sh.Shards)))
	}
	return s
}

// ShardLimit is one shard's part of l when a key is split in k shards (see
// sluice.Limit.Share): the shards never add up to more than l.
func ShardLimit(l sluice.Limit, k int) sluice.Limit { return l.Share(k) }

// Warnings are the doubts `sluice check` raises about a valid rule set:
// rules that fail closed (money, security) with a sync mode that can admit
// more than their limit.
func (c *Config) Warnings() []string {
	var w []string
	for _, r := range c.Rules {
		if r.FailClosed && r.Sync.Mode.OverAdmits() {
			w = append(w, fmt.Sprintf("%s:%d: rule %s fails closed (a money or security limit) but uses sync: %s, which can admit more than its limit across gateways; use exact or lease", c.File, r.Line, r.ID, r.Sync.Mode))
		}
		if r.MissingKey == MissingSkip && r.Envoy == nil {
			w = append(w, fmt.Sprintf("%s:%d: rule %s says onMissingKey: skip: a request it matches without %s is not counted by it at all", c.File, r.Line, r.ID, keyNames(r.Key)))
		}
	}
	return w
}

// String describes the match in words.
func (m *Match) String() string {
	var parts []string
	if len(m.Methods) > 0 {
		parts = append(parts, strings.Join(m.Methods, "|"))
	}
	if len(m.Paths) > 0 {
		ps := make([]string, len(m.Paths))
		for i, p := range m.Paths {
			ps[i] = p.String()
		}
		parts = append(parts, strings.Join(ps, "|"))
	}
	if len(m.NotPaths) > 0 {
		ps := make([]string, len(m.NotPaths))
		for i, p := range m.NotPaths {
			ps[i] = p.String()
		}
		parts = append(parts, "except "+strings.Join(ps, "|"))
	}
	if len(m.Hosts) > 0 {
		parts = append(parts, "on "+strings.Join(m.Hosts, "|"))
	}
	if len(m.Values) > 0 {
		parts = append(parts, "with "+valueSetsWords(m.Values, " and "))
	}
	if len(parts) == 0 {
		return "every request"
	}
	return strings.Join(parts, " ")
}

// valueSetsWords names value sets: "plan gold|silver", "ip 10.0.0.0/8";
// a hashed source's values (secrets, such as API keys) by their count.
func valueSetsWords(sets []ValueSet, join string) string {
	out := make([]string, 0, len(sets))
	for _, v := range sets {
		name := "(a key source)"
		hashed := false
		if v.Source != nil {
			name, hashed = v.Source.Name, v.Source.Hash
		}
		n := len(v.Values) + len(v.Prefixes)
		if hashed {
			out = append(out, fmt.Sprintf("%s in %d listed values", name, n))
			continue
		}
		vals := make([]string, 0, n)
		for x := range v.Values {
			vals = append(vals, x)
		}
		sort.Strings(vals)
		for _, p := range v.Prefixes {
			vals = append(vals, p.String())
		}
		if len(vals) > 5 {
			vals = append(vals[:5], fmt.Sprintf("(%d more)", len(vals)-5))
		}
		out = append(out, name+" "+strings.Join(vals, "|"))
	}
	return strings.Join(out, join)
}

// amountWords writes a duration as an amount: "1 second", "15 minutes".
func amountWords(d time.Duration) string {
	w := periodWords(d)
	if w != "" && w[0] >= 'a' && w[0] <= 'z' {
		return "1 " + w
	}
	return w
}

// Ceiling states a limit's burst ceiling in words: "at most 20 at once, then
// 100 per minute" for the bucket family (over any interval t, at most
// b + r*t), or the window's guarantee for the window algorithms.
func Ceiling(l sluice.Limit) string {
	per := periodWords(l.Period)
	switch l.Algorithm {
	case sluice.FixedWindow:
		if l.Calendar {
			cal := map[time.Duration]string{sluice.CalendarDay: "calendar day (UTC, from midnight)", sluice.CalendarWeek: "calendar week (UTC, from Monday)",
				sluice.CalendarMonth: "calendar month (UTC, from the 1st)", sluice.CalendarYear: "calendar year (UTC, from January 1st)"}[l.Period]
			return fmt.Sprintf("at most %d per %s (up to %d across a boundary)", l.Rate, cal, 2*l.Rate)
		}
		return fmt.Sprintf("at most %d per %s window (up to %d across a window boundary)", l.Rate, per, 2*l.Rate)
	case sluice.SlidingLog:
		return fmt.Sprintf("at most %d in any %s", l.Rate, per)
	case sluice.SlidingWindow:
		return fmt.Sprintf("about %d per sliding %s (at most %d per aligned window)", l.Rate, per, l.Rate)
	case sluice.LeakyQueue:
		return fmt.Sprintf("at most %d queued, sent at %d per %s", l.Capacity(), l.Rate, per)
	}
	return fmt.Sprintf("at most %d at once, then %d per %s", l.Capacity(), l.Rate, per)
}

// periodWords writes a period as "minute", "15 minutes", "500 milliseconds".
func periodWords(d time.Duration) string {
	units := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}, {time.Millisecond, "millisecond"}}
	for _, u := range units {
		if d%u.d == 0 {
			n := d / u.d
			if n == 1 {
				return u.name
			}
			return fmt.Sprintf("%d %ss", n, u.name)
		}
	}
	return d.String()
}

// keyNames names a rule's key sources, "phone" or "user+ip".
func keyNames(key []*Source) string {
	names := make([]string, len(key))
	for i, s := range key {
		names[i] = s.Name
	}
	return strings.Join(names, "+")
}

// missingWords says what the rule does with a request it matches that lacks
// its key; nothing for a key every request has (address, route, method,
// path).
func missingWords(r *Rule) string {
	always := true
	for _, s := range r.Key {
		switch s.Kind {
		case FromIP, FromRoute, FromMethod, FromPath:
		default:
			always = false
		}
	}
	if always {
		return ""
	}
	switch r.MissingKey {
	case MissingReject:
		return " (without it: refused)"
	case MissingSkip:
		return " (without it: not counted)"
	default:
		return " (without it: per " + keyNames(r.FallbackKey) + ")"
	}
}

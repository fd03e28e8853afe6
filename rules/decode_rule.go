package rules

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/sluice-rl/sluice"
	"go.yaml.in/yaml/v3"
)

// keyLimit is a limit of a rule for some key values (its keyLimits list).
type keyLimit struct {
	values []ValueSet
	limit  sluice.Limit // unset fields: the rule's
	node   *yaml.Node
	field  string
}

// keyLimitRules returns the rules of r's key limits, and takes their
// values out of r (and of its windows): rule "per-key" with a key limit for
// partner keys becomes "per-key", which exempts them, and
// "per-key.key-limit-1", which applies only to them, with the key limit's
// rate, period and burst (the rule's where unset). A key has one count per
// limit, as in every other change of limit: a key limit starts its keys
// fresh.
func (d *decoder) keyLimitRules(r *Rule) []*Rule {
	var out []*Rule
	for i, o := range r.keyLimits {
		x := *r
		x.keyLimits, x.also = nil, nil
		x.ID = fmt.Sprintf("%s.key-limit-%d", r.ID, i+1)
		x.KeyLimitOf = r.ID
		x.Match.Values = append(slices.Clone(r.Match.Values), o.values...)
		l := r.Limit
		if o.limit.Rate > 0 {
			l.Rate = o.limit.Rate
		}
		if o.limit.Period > 0 {
			l.Period = o.limit.Period
		}
		if o.limit.Burst > 0 || o.limit.Rate > 0 {
			l.Burst = o.limit.Burst // a new rate with no burst: the burst is the rate
		}
		if err := l.Validate(); err != nil {
			d.fail(o.node, o.field, "%s", strings.TrimPrefix(err.Error(), "invalid limit: "))
			continue
		}
		if x.Cost > l.Capacity() {
			d.fail(o.node, o.field, "cost %d is more than the key limit's burst %d: no request could ever pass", x.Cost, l.Capacity())
			continue
		}
		x.Limit, x.Fallback = l, l
		out = append(out, &x)
	}
	for _, o := range r.keyLimits {
		r.Exempt = append(r.Exempt, o.values...)
	}
	return out
}

// window is one of a rule's further windows (its also list).
type window struct {
	limit   sluice.Limit
	algoSet bool
	node    *yaml.Node
	field   string
}

// windows returns the rules of r's further windows: copies of r, each with
// its own limit and the id "<id>.<period>" (api.1m, api.1h). Together with r
// they are several windows of one rule, as Kong's users write 10 per second
// and 100 per minute and 1,000 per hour: a request passes only if every
// window admits it (the engine decides all of a request's rules at once,
// all or nothing), and the answer names the window that refused, or the
// one closest to its limit.
func (d *decoder) windows(r *Rule, field string) []*Rule {
	var out []*Rule
	periods := map[time.Duration]bool{r.Limit.Period: true}
	for _, w := range r.also {
		if periods[w.limit.Period] {
			// Each window is counted under the rule's id and its period:
			// two of one period would be one count.
			d.fail(w.node, w.field+".per", "a second window of %s: each window of a rule needs its own period", sluice.FormatPeriod(w.limit.Period))
			continue
		}
		periods[w.limit.Period] = true
		x := *r
		x.also, x.keyLimits = nil, nil
		x.Limit, x.Fallback = w.limit, w.limit
		x.ID = r.ID + "." + sluice.FormatPeriod(w.limit.Period)
		if err := w.limit.Validate(); err != nil {
			d.fail(w.node, w.field, "%s", strings.TrimPrefix(err.Error(), "invalid limit: "))
			continue
		}
		if x.Cost > w.limit.Capacity() {
			d.fail(w.node, w.field, "cost %d is more than this window's burst %d: no request could ever pass", x.Cost, w.limit.Capacity())
			continue
		}
		out = append(out, &x)
	}
	return out
}

// A rule is decoded in three steps: its fields, each by its own decoder
// (rule); the limit they make together (ruleLimit); and the combinations
// of features that cannot work together (ruleCombinations). Every fault
// is collected, with the field's line and column.

// ruleNodes are the nodes a rule's later checks point at, and its
// fallback section, which is read after the limit it defaults to.
type ruleNodes struct {
	rate, per, burst, cost *yaml.Node
	fallback               *yaml.Node
	fallbackLimit          sluice.Limit
	delayAfter             *yaml.Node
}

func (d *decoder) rule(c *Config, n *yaml.Node, field string) *Rule {
	r := &Rule{Cost: 1, Line: n.Line}
	var at ruleNodes
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"id":     func(v *yaml.Node, f string) { r.ID = d.id(v, f) },
		"match":  func(v *yaml.Node, f string) { d.match(c, &r.Match, v, f) },
		"exempt": func(v *yaml.Node, f string) { r.Exempt = d.valueSets(c, v, f) },
		"key":    func(v *yaml.Node, f string) { r.Key = d.sources(c, v, f) },

		// The limit.
		"rate":      func(v *yaml.Node, f string) { at.rate = v; r.Limit.Rate, _ = d.positive(v, f) },
		"per":       func(v *yaml.Node, f string) { at.per = v; r.Limit.Period, _ = d.period(v, f) },
		"burst":     func(v *yaml.Node, f string) { at.burst = v; r.Limit.Burst, _ = d.positive(v, f) },
		"algorithm": func(v *yaml.Node, f string) { r.Limit.Algorithm, _ = d.algorithm(v, f) },
		"calendar":  func(v *yaml.Node, f string) { r.Limit.Calendar, _ = d.boolean(v, f) },
		"also":      func(v *yaml.Node, f string) { r.also = d.also(v, f) },
		"keyLimits": func(v *yaml.Node, f string) { r.keyLimits = append(r.keyLimits, d.keyLimitList(c, v, f)...) },
		// The former name of keyLimits, still read.
		"overrides": func(v *yaml.Node, f string) { r.keyLimits = append(r.keyLimits, d.keyLimitList(c, v, f)...) },
		"cost":      func(v *yaml.Node, f string) { at.cost = v; r.Cost, _ = d.positive(v, f) },
		"unit":      func(v *yaml.Node, f string) { r.Unit = d.unit(v, f) },

		// What counts, and when.
		"mode": func(v *yaml.Node, f string) {
			i, _ := d.choice(v, f, "enforce or shadow", "enforce", "shadow")
			r.Shadow = i == 1
		},
		"countOn":  func(v *yaml.Node, f string) { r.CountOn = d.countOn(v, f) },
		"reserve":  func(v *yaml.Node, f string) { r.Reserve = d.reserve(v, f) },
		"tiers":    func(v *yaml.Node, f string) { r.Tiers = d.tiers(c, v, f) },
		"adaptive": func(v *yaml.Node, f string) { r.Adaptive, _ = d.boolean(v, f) },
		"penalty":  func(v *yaml.Node, f string) { r.Penalty = d.penalty(v, f) },
		"onMissingKey": func(v *yaml.Node, f string) {
			i, ok := d.choice(v, f, "fallback (the default: counted under fallbackKey, the client address unless set), reject (400) or skip (not counted by this rule)",
				"fallback", "reject", "skip")
			if ok {
				r.MissingKey = []MissingKeyMode{MissingFallback, MissingReject, MissingSkip}[i]
			}
		},
		"fallbackKey": func(v *yaml.Node, f string) { r.FallbackKey = d.sources(c, v, f) },
		"showKeys":    func(v *yaml.Node, f string) { r.ShowKeys, _ = d.boolean(v, f) },
		"status":      func(v *yaml.Node, f string) { r.RefusalStatus = d.refusalStatus(v, f) },
		"delayAfter":  func(v *yaml.Node, f string) { at.delayAfter = v; r.DelayAfter, _ = d.positive(v, f) },

		// When the store fails or is slow, and how gateways share it.
		"failMode": func(v *yaml.Node, f string) {
			i, _ := d.choice(v, f, "open or closed", "open", "closed")
			r.FailClosed = i == 1
		},
		"onSlowStore": func(v *yaml.Node, f string) { r.SlowStoreWait = d.slowStore(v, f) },
		"fallback":    func(v *yaml.Node, f string) { at.fallback, at.fallbackLimit = v, d.fallbackLimit(v, f) },
		"sync":        func(v *yaml.Node, f string) { d.sharing(&r.Sync, v, f) },
		"regions":     func(v *yaml.Node, f string) { r.Regions = d.regions(v, f) },
		"global":      func(v *yaml.Node, f string) { r.Global = d.global(v, f) },

		"envoy": func(v *yaml.Node, f string) { r.Envoy = d.envoyMatch(v, f) },
	})
	if n.Kind != yaml.MappingNode {
		return nil
	}
	if r.ID == "" {
		d.fail(n, field+".id", "missing: every rule needs an id")
	}
	if len(r.Key) == 0 && r.Envoy == nil && !d.failedUnder(field+".key") {
		d.fail(n, field+".key", "missing: say whose requests count, such as [user] or [ip]")
	}
	if len(r.FallbackKey) == 0 {
		r.FallbackKey = []*Source{{Name: "ip", Kind: FromIP}}
	}
	d.ruleLimit(r, n, field, &at)
	if at.delayAfter != nil && r.Limit.Algorithm != sluice.LeakyQueue {
		d.fail(at.delayAfter, field+".delayAfter", "applies to leaky-queue rules: it lets the first requests beyond the rate through before the rest wait; this rule is %s", r.Limit.Algorithm)
	}
	d.ruleCombinations(r, n, field)
	return r
}

// refusalStatus decodes a rule's status:, the HTTP status of its refusals.
func (d *decoder) refusalStatus(n *yaml.Node, field string) int {
	x, ok := d.integer(n, field)
	if ok && x != http.StatusTooManyRequests && x != http.StatusServiceUnavailable {
		d.fail(n, field, "want 429 (Too Many Requests, the default) or 503 (Service Unavailable, as nginx's limit_req answers by default), got %d", x)
		return 0
	}
	return int(x)
}

// ruleLimit checks the limit a rule's rate, per, burst and cost make, and
// sets what defaults to it: the fallback limit and the algorithm of its
// further windows.
func (d *decoder) ruleLimit(r *Rule, n *yaml.Node, field string, at *ruleNodes) {
	if at.rate == nil {
		d.fail(n, field+".rate", "missing")
	}
	if at.per == nil {
		d.fail(n, field+".per", "missing: a period such as 1s, 1m, 15m, 1h or 1d")
	}
	if r.Limit.Rate > 0 && r.Limit.Period > 0 && r.Limit.Burst >= 0 {
		if err := r.Limit.Validate(); err != nil {
			node := at.burst
			if node == nil {
				node = at.rate
			}
			d.fail(node, field, "%s", strings.TrimPrefix(err.Error(), "invalid limit: "))
		} else if r.Cost > r.Limit.Capacity() {
			d.fail(at.cost, field+".cost", "cost %d is more than the burst %d: no request could ever pass", r.Cost, r.Limit.Capacity())
		}
	}
	r.Fallback = r.Limit
	if at.fallback != nil {
		fb := at.fallbackLimit
		if fb.Period == 0 {
			fb.Period = r.Limit.Period
		}
		if err := fb.Validate(); err != nil {
			d.fail(at.fallback, field+".fallback", "%s", strings.TrimPrefix(err.Error(), "invalid limit: "))
		}
		r.Fallback, r.FallbackSet = fb, true
	}
	for i := range r.also {
		if !r.also[i].algoSet { // unset: the rule's algorithm
			r.also[i].limit.Algorithm = r.Limit.Algorithm
		}
	}
}

// ruleCombinations refuses the features a rule asks for together that
// cannot work together, each with the reason.
func (d *decoder) ruleCombinations(r *Rule, n *yaml.Node, field string) {
	limitValid := r.Limit.Rate > 0 && r.Limit.Period > 0 && r.Limit.Validate() == nil
	if rv := r.Reserve; rv != nil {
		switch {
		case len(r.CountOn) > 0:
			d.fail(n, field+".reserve", "a rule counts either on a status (countOn) or a settled cost (reserve), not both")
		case r.Shadow:
			d.fail(n, field+".reserve", "shadow rules count nothing to settle: drop reserve or mode: shadow")
		case r.Envoy != nil:
			d.fail(n, field+".reserve", "reserve applies to HTTP rules, not Envoy descriptors")
		case r.Sync.Shards > 1:
			d.fail(n, field+".reserve", "a reservation is settled on the key it was taken from: reserve cannot use shards")
		case limitValid && rv.Estimate > r.Limit.Capacity():
			d.fail(n, field+".reserve.estimate", "estimate %d is more than the burst %d: no request could ever pass", rv.Estimate, r.Limit.Capacity())
		}
	}
	if r.Tiers != nil && r.Sync.Shards > 1 {
		d.fail(n, field+".tiers", "tiers share one count: they cannot use shards")
	}
	if r.Envoy != nil && r.Limit.Algorithm == sluice.SlidingLog {
		// Envoy's usage reports (a descriptor's hits_addend) are charged
		// beyond the limit, a debt later checks wait out; a log never holds
		// more than its limit, so a spent budget would never be refused.
		d.fail(n, field+".algorithm", "Envoy descriptors charge reported usage beyond the limit, which a sliding-log cannot hold: use sliding-window, gcra or another algorithm")
	}
	if r.Adaptive {
		switch a := r.Limit.Algorithm; {
		case a != sluice.GCRA && a != sluice.TokenBucket && a != sluice.LeakyMeter:
			d.fail(n, field+".adaptive", "an adaptive rate needs gcra, token-bucket or leaky-meter (a rate that can shrink smoothly), not %s", a)
		case r.Reserve != nil || len(r.CountOn) > 0 || r.Shadow || r.Envoy != nil:
			d.fail(n, field+".adaptive", "adaptive rules count each request as it comes: not with reserve, countOn, mode: shadow or Envoy descriptors")
		case limitValid && AdaptiveLimit(r.Limit).Validate() != nil:
			d.fail(n, field+".adaptive", "%d per %v is too fine to shrink in steps of 1/%d", r.Limit.Rate, r.Limit.Period, AdaptiveScale)
		}
	}
	if g := r.Global; g != nil {
		switch {
		case r.Limit.Algorithm != sluice.TokenBucket:
			d.fail(n, field+".global", "a global limit is a token-bucket (each region spends its part of one bucket), not %s", r.Limit.Algorithm)
		case r.Sync.Mode != sluice.SyncExact || r.Sync.Shards > 1:
			d.fail(n, field+".global", "a global limit decides exactly in each region: sync: exact without shards, not %s", r.Sync.Mode)
		case len(r.Regions) > 0:
			d.fail(n, field+".global", "regions and global both divide the limit among regions: keep one (global moves shares to where demand is)")
		case r.Reserve != nil || r.Tiers != nil || r.Adaptive || len(r.CountOn) > 0:
			d.fail(n, field+".global", "a global limit counts each request as it comes: not with reserve, tiers, adaptive or countOn")
		}
	}
	switch a := r.Limit.Algorithm; {
	case (r.Sync.Mode == sluice.SyncLease || r.Sync.Mode == sluice.SyncAuto) &&
		a != sluice.GCRA && a != sluice.TokenBucket && a != sluice.LeakyMeter && a != sluice.FixedWindow:
		// Units leased now and spent later would count at the wrong time in
		// a sliding window (and skip a leaky queue's delays).
		d.fail(n, field+".sync", "sync: %s needs gcra, token-bucket, leaky-meter or fixed-window, not %s", r.Sync.Mode, a)
	case r.Sync.Mode == sluice.SyncPeriodic && a == sluice.LeakyQueue:
		d.fail(n, field+".sync", "sync: sync cannot delay requests as a leaky queue does; use exact")
	case r.Sync.Shards > 1 && r.Sync.Mode != sluice.SyncExact && r.Sync.Mode != sluice.SyncLease:
		d.fail(n, field+".sync.shards", "shards apply to exact and lease, not %s", r.Sync.Mode)
	case r.Sync.Shards > 1 && int64(r.Sync.Shards) > r.Limit.Rate:
		d.fail(n, field+".sync.shards", "%d shards of a rate of %d would give each shard less than one unit", r.Sync.Shards, r.Limit.Rate)
	}
}

// id decodes a rule's id.
func (d *decoder) id(v *yaml.Node, f string) string {
	s, ok := d.str(v, f)
	if ok && !validID(s) {
		d.fail(v, f, "%q: an id is 1-64 letters, digits, '-', '_' or '.'", s)
	}
	return s
}

// sources decodes a list of key source names (key, fallbackKey).
func (d *decoder) sources(c *Config, v *yaml.Node, f string) []*Source {
	var out []*Source
	names, nodes := d.strings(v, f)
	for i, name := range names {
		s, err := c.source(name)
		if err != nil {
			d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%v", err)
			continue
		}
		out = append(out, s)
	}
	return out
}

// algorithm decodes an algorithm's name.
func (d *decoder) algorithm(v *yaml.Node, f string) (sluice.Algorithm, bool) {
	s, ok := d.str(v, f)
	if !ok {
		return 0, false
	}
	a, err := sluice.ParseAlgorithm(s)
	if err != nil {
		d.fail(v, f, "%s", strings.TrimPrefix(err.Error(), "sluice: "))
		return 0, false
	}
	return a, true
}

// unit decodes the word for what a rule counts.
func (d *decoder) unit(v *yaml.Node, f string) string {
	s, ok := d.str(v, f)
	if ok && (s == "" || len(s) > 32 || strings.ContainsFunc(s, func(c rune) bool { return !unicode.IsLetter(c) && c != ' ' && c != '-' })) {
		d.fail(v, f, "%q: want a word for what the rule counts, such as tokens (letters, at most 32)", s)
	}
	return s
}

// countOn decodes the response statuses that count.
func (d *decoder) countOn(v *yaml.Node, f string) []int {
	var out []int
	d.fields(v, f, map[string]func(*yaml.Node, string){
		"status": func(v *yaml.Node, f string) {
			items := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				items = v.Content
			}
			for i, item := range items {
				itemField := fmt.Sprintf("%s[%d]", f, i)
				if x, ok := d.integer(item, itemField); ok {
					if x < 100 || x > 599 {
						d.fail(item, itemField, "%d is not an HTTP status", x)
					}
					out = append(out, int(x))
				}
			}
		},
	})
	if len(out) == 0 {
		d.fail(v, f+".status", "list the response statuses that count")
	}
	return out
}

// penalty decodes a rule's lock-out after repeated rejections.
func (d *decoder) penalty(v *yaml.Node, f string) *Penalty {
	p := &Penalty{}
	d.fields(v, f, map[string]func(*yaml.Node, string){
		"after": func(v *yaml.Node, f string) { p.After, _ = d.positive(v, f) },
		"block": func(v *yaml.Node, f string) { p.Block, _ = d.period(v, f) },
	})
	if p.After == 0 || p.Block == 0 {
		d.fail(v, f, "give both after (rejections) and block (a period such as 15m)")
	}
	return p
}

// envoyMatch decodes the Envoy descriptors a rule answers.
func (d *decoder) envoyMatch(v *yaml.Node, f string) *EnvoyDescriptor {
	m := &EnvoyDescriptor{}
	d.fields(v, f, map[string]func(*yaml.Node, string){
		"domain": func(v *yaml.Node, f string) { m.Domain, _ = d.str(v, f) },
		"descriptors": func(v *yaml.Node, f string) {
			if v.Kind != yaml.SequenceNode {
				d.fail(v, f, "want a list of {key, value}")
				return
			}
			for i, item := range v.Content {
				var e EnvoyEntry
				d.fields(item, fmt.Sprintf("%s[%d]", f, i), map[string]func(*yaml.Node, string){
					"key":   func(v *yaml.Node, f string) { e.Key, _ = d.str(v, f) },
					"value": func(v *yaml.Node, f string) { e.Value, _ = d.str(v, f) },
				})
				if e.Key == "" {
					d.fail(item, fmt.Sprintf("%s[%d].key", f, i), "missing")
				}
				m.Entries = append(m.Entries, e)
			}
		},
	})
	if m.Domain == "" || len(m.Entries) == 0 {
		d.fail(v, f, "give a domain and at least one descriptor entry")
	}
	return m
}

// keyLimitList decodes a rule's key limits: limits for some key values.
func (d *decoder) keyLimitList(c *Config, v *yaml.Node, f string) []keyLimit {
	var out []keyLimit
	d.each(v, f, "a list such as [{values: {api_key: [K]}, rate: 1000}]", func(item *yaml.Node, of string) {
		o := keyLimit{node: item, field: of}
		d.fields(item, of, map[string]func(*yaml.Node, string){
			"values": func(v *yaml.Node, f string) { o.values = d.valueSets(c, v, f) },
			"rate":   func(v *yaml.Node, f string) { o.limit.Rate, _ = d.integer(v, f) },
			"per":    func(v *yaml.Node, f string) { o.limit.Period, _ = d.period(v, f) },
			"burst":  func(v *yaml.Node, f string) { o.limit.Burst, _ = d.integer(v, f) },
		})
		if len(o.values) == 0 {
			d.fail(item, of+".values", "missing: the key values the limit is for, such as {api_key: [K]}")
			return
		}
		out = append(out, o)
	})
	return out
}

// also decodes a rule's further windows.
func (d *decoder) also(v *yaml.Node, f string) []window {
	var out []window
	d.each(v, f, "a list of further windows, such as [{rate: 100, per: 1m}, {rate: 1000, per: 1h}]", func(item *yaml.Node, wf string) {
		w := window{node: item, field: wf}
		d.fields(item, wf, map[string]func(*yaml.Node, string){
			"rate":     func(v *yaml.Node, f string) { w.limit.Rate, _ = d.integer(v, f) },
			"per":      func(v *yaml.Node, f string) { w.limit.Period, _ = d.period(v, f) },
			"burst":    func(v *yaml.Node, f string) { w.limit.Burst, _ = d.integer(v, f) },
			"calendar": func(v *yaml.Node, f string) { w.limit.Calendar, _ = d.boolean(v, f) },
			"algorithm": func(v *yaml.Node, f string) {
				if s, ok := d.str(v, f); ok {
					a, err := sluice.ParseAlgorithm(s)
					if err != nil {
						d.fail(v, f, "%v", err)
					}
					w.limit.Algorithm, w.algoSet = a, true
				}
			},
		})
		if w.limit.Rate <= 0 || w.limit.Period <= 0 {
			d.fail(item, wf, "give a rate and a period (per), such as {rate: 100, per: 1m}")
			return
		}
		out = append(out, w)
	})
	return out
}

// fallbackLimit decodes a rule's own limit for while the store fails
// (always GCRA); an unset period is the rule's, filled in by ruleLimit.
func (d *decoder) fallbackLimit(v *yaml.Node, f string) sluice.Limit {
	fb := sluice.Limit{Algorithm: sluice.GCRA}
	d.fields(v, f, map[string]func(*yaml.Node, string){
		"rate":  func(v *yaml.Node, f string) { fb.Rate, _ = d.integer(v, f) },
		"per":   func(v *yaml.Node, f string) { fb.Period, _ = d.period(v, f) },
		"burst": func(v *yaml.Node, f string) { fb.Burst, _ = d.integer(v, f) },
	})
	return fb
}

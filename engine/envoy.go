package engine

import (
	"context"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// envoyNode is a level of a domain's descriptor tree, as envoyproxy/ratelimit
// builds it: a request descriptor of N entries is matched N levels deep, the
// most specific value first (exact, then wildcard, then any value).
type envoyNode struct {
	children []envoyChild
}

type envoyChild struct {
	entry rules.EnvoyEntry
	node  *envoyNode
	rule  *rule
}

func (rs *ruleSet) addEnvoy(r *rule) {
	if rs.envoy == nil {
		rs.envoy = map[string]*envoyNode{}
	}
	node := rs.envoy[r.Envoy.Domain]
	if node == nil {
		node = &envoyNode{}
		rs.envoy[r.Envoy.Domain] = node
	}
	for i, e := range r.Envoy.Entries {
		var child *envoyChild
		for j := range node.children {
			if node.children[j].entry == e {
				child = &node.children[j]
			}
		}
		if child == nil {
			node.children = append(node.children, envoyChild{entry: e, node: &envoyNode{}})
			child = &node.children[len(node.children)-1]
		}
		if i == len(r.Envoy.Entries)-1 && child.rule == nil {
			child.rule = r
		}
		node = child.node
	}
}

// lookup finds the rule of a descriptor, or nil.
func (n *envoyNode) lookup(entries []rules.EnvoyEntry) *rule {
	var found *rule
	for _, e := range entries {
		if n == nil {
			return nil
		}
		var best *envoyChild
		score := 0
		for i := range n.children {
			c := &n.children[i]
			if c.entry.Key != e.Key {
				continue
			}
			if s := c.entry.Matches(e.Value); s > score {
				best, score = c, s
			}
		}
		if best == nil {
			return nil
		}
		n, found = best.node, best.rule
	}
	return found
}

// Descriptor is one descriptor of an Envoy rate limit request.
type Descriptor struct {
	Entries []rules.EnvoyEntry
	// Limit, the descriptor limit, replaces its rule's limit: Envoy's
	// RateLimitDescriptor.limit.
	Limit *sluice.Limit
	// Hits is what the descriptor takes; Negative gives Hits back instead
	// (Envoy's is_negative_hits). Without HitsSet, 0 means 1.
	//
	// HitsSet marks a descriptor's own hits_addend: Envoy's token-quota
	// pattern, a check of 0 hits on the request path and the usage, known
	// once the stream is done (apply_on_stream_done), reported after it.
	// A Hits of 0 is then that check: over the limit only when the count is
	// over it (in debt), not when it is at it. A Hits above 0 is a usage
	// report, charged even beyond the limit (sluice.Take.Charge: a debt
	// later requests wait out), as envoyproxy/ratelimit counts every hit;
	// its status is over the limit when the count is over it after the
	// charge. Hits from the request's hits_addend, or the default 1, are
	// taken all or nothing, as sluice's other APIs take them.
	Hits     int64
	HitsSet  bool
	Negative bool
}

// CheckDescriptors answers Envoy's ShouldRateLimit for domain as the
// reference service (envoyproxy/ratelimit) does: res.Statuses has one status
// per descriptor, in order. A descriptor that matches no limit, a
// whitelisted one (no rate_limit and no nested descriptors), one of an
// unknown domain (even with a descriptor limit), and one whose limit another
// matched limit replaces have Rule "" and count nothing; an unlimited one has
// Unlimited set; a requests_per_unit: 0 limit is always over. Every counted
// descriptor is taken in one store call, all or nothing; quota_mode
// descriptors each in a call of their own after it, and the request is over
// the limit when a plain descriptor is, or when every quota descriptor is;
// usage reports (see Descriptor) are charged in a call of their own, whatever
// the others decide; shadow descriptors are counted in a call of their own
// and never over.
func (e *Engine) CheckDescriptors(ctx context.Context, domain string, descs []Descriptor, res *Result) error {
	rs := e.set.Load()
	res.reset(rs)
	counted := e.lookupDescriptors(rs, domain, descs, res)
	if err := e.takeDescriptors(ctx, counted, res); err != nil {
		return err
	}
	combineDescriptors(res)
	e.decisions.log(res, "envoy", "")
	e.observe(res)
	return nil
}

// descriptorTake is a descriptor that counts: its rule and limit, what it
// takes, and its key (res.keyBuf[start:end]).
type descriptorTake struct {
	i          int // the descriptor's index
	r          *rule
	limit      sluice.Limit
	cost       int64
	usage      bool // a usage report: charged, see Descriptor
	start, end int
}

// lookupDescriptors matches each descriptor to its rule (or its descriptor
// limit),
// answers those that count nothing (no rule, whitelisted, replaced,
// unlimited, requests_per_unit: 0) in res.Statuses, and returns the others
// with their keys built.
func (e *Engine) lookupDescriptors(rs *ruleSet, domain string, descs []Descriptor, res *Result) []descriptorTake {
	tree, known := rs.envoy[domain]
	matchedRule := make([]*rule, len(descs))
	replaced := map[string]bool{}
	for i, d := range descs {
		if r := tree.lookup(d.Entries); r != nil && !r.Envoy.Whitelisted {
			matchedRule[i] = r
			for _, name := range r.Envoy.Replaces {
				replaced[name] = true
			}
		}
	}
	res.Statuses = res.Statuses[:0]
	for range descs {
		res.Statuses = append(res.Statuses, Status{Decision: sluice.Decision{Allowed: true}})
	}
	var list []descriptorTake
	for i, d := range descs {
		r := matchedRule[i]
		limit := sluice.Limit{}
		var own *sluice.Limit // the descriptor's own limit
		if d.Limit != nil && known {
			own = e.descriptorLimit(domain, r, *d.Limit)
		}
		switch {
		case own != nil:
			if r == nil {
				r = &rule{Rule: &rules.Rule{ID: domain + descriptorLimitID, Limit: *own, Cost: 1, Envoy: &rules.EnvoyDescriptor{Domain: domain}}, stats: &unreported}
				r.fallbackID = r.ID + "#fallback"
			}
			limit = *own
		case r != nil && r.Envoy.Unlimited:
			res.Statuses[i].Unlimited = true
			continue
		case r == nil || (r.Envoy.Name != "" && replaced[r.Envoy.Name] && !replacesItself(r)):
			continue
		default:
			limit = r.Limit
		}
		hits := d.Hits
		if !d.HitsSet {
			hits = max(hits, 1)
		}
		if d.Negative {
			hits = -hits
		}
		if r.Envoy.Deny && own == nil {
			denied(&res.Statuses[i], r, limit)
			continue
		}
		start := len(res.keyBuf)
		res.keyBuf = appendDescriptorKey(res.keyBuf, r, d.Entries)
		res.keyBuf = boundKey(res.keyBuf, start)
		usage := d.HitsSet && hits > 0 && !r.Shadow
		list = append(list, descriptorTake{i: i, r: r, limit: limit, cost: hits, usage: usage, start: start, end: len(res.keyBuf)})
	}
	return list
}

// descriptorLimitID names, after its domain, the counts of descriptor
// limits that no rule of the domain matches.
const descriptorLimitID = "#descriptor-limit"

// descriptorLimit is a descriptor's own limit: counted with its rule's
// algorithm (a fixed window without a rule), or nil past the bound on
// distinct descriptor limits.
func (e *Engine) descriptorLimit(domain string, r *rule, l sluice.Limit) *sluice.Limit {
	id, alg := domain+descriptorLimitID, sluice.FixedWindow
	if r != nil {
		id, alg = r.ID, r.Limit.Algorithm
	}
	l.Algorithm = alg
	if !alg.IsBucket() {
		l.Burst = 0
	}
	if !e.descLimits.admit(id, l) {
		return nil
	}
	return &l
}

// denied answers a requests_per_unit: 0 descriptor: always over, consuming
// nothing, with the end of the current unit (aligned to the Unix epoch, as
// fixed windows are) as its reset: what the reference answers.
func denied(st *Status, r *rule, limit sluice.Limit) {
	left := limit.Period
	if limit.Period > 0 {
		left -= time.Duration(time.Now().UnixNano() % int64(limit.Period))
	}
	st.r, st.Shadow = r, r.Shadow
	st.Decision = sluice.Decision{Reason: sluice.ReasonLimited, Rule: r.ID, Limit: limit,
		RetryAfter: left, ResetAfter: left}
	st.count(false) // a deny rule refuses the request
}

// appendDescriptorKey appends a descriptor's key: its entries,
// length-prefixed; a share_threshold wildcard counts under its pattern,
// not the value.
func appendDescriptorKey(buf []byte, r *rule, entries []rules.EnvoyEntry) []byte {
	for j, en := range entries {
		v := en.Value
		if r.Envoy != nil && j < len(r.Envoy.Entries) && r.Envoy.Entries[j].Share {
			v = r.Envoy.Entries[j].Value // every matching value shares one count
		}
		buf = strconv.AppendInt(buf, int64(len(en.Key)+1+len(v)), 10)
		buf = append(buf, ':')
		buf = append(buf, en.Key...)
		buf = append(buf, '=')
		buf = append(buf, v...)
	}
	return buf
}

// descriptorGroup is one store call of a check: the plain descriptors
// together (all or nothing), each quota descriptor alone, the usage
// reports, or the shadow descriptors.
type descriptorGroup struct {
	shadow, quota, usage bool
	only                 int // for a quota descriptor: its index in the list
}

func (g descriptorGroup) holds(j int, c *descriptorTake) bool {
	switch {
	case g.shadow != c.r.Shadow:
		return false
	case g.shadow:
		return true
	case g.usage != c.usage:
		return false
	case g.usage:
		return true
	case g.quota && j != g.only, !g.quota && c.r.Envoy.QuotaMode:
		return false
	}
	return true
}

// takeDescriptors takes the counted descriptors, group by group; a group
// whose call fails is answered by each rule's fail mode (failMode), as
// Check answers.
func (e *Engine) takeDescriptors(ctx context.Context, list []descriptorTake, res *Result) error {
	groups := []descriptorGroup{{}}
	for j, c := range list {
		if c.r.Envoy.QuotaMode && !c.r.Shadow && !c.usage {
			groups = append(groups, descriptorGroup{quota: true, only: j})
		}
	}
	groups = append(groups, descriptorGroup{usage: true}, descriptorGroup{shadow: true})
	plainRefused := false
	for _, g := range groups {
		res.takes = res.takes[:0]
		res.idx = res.idx[:0]
		var wait time.Duration // the longest a rule of the group waits for a slow store
		for j := range list {
			c := &list[j]
			if !g.holds(j, c) {
				continue
			}
			if err := c.limit.Validate(); err != nil {
				return err
			}
			wait = max(wait, c.r.SlowStoreWait)
			res.takes = append(res.takes, sluice.Take{Rule: c.r.ID, Key: view.String(res.keyBuf[c.start:c.end]), Limit: c.limit, Cost: c.cost,
				DryRun: g.quota && plainRefused, // a refused request consumes no quota either
				Charge: g.usage})
			if e.past.has(c.r.ID) { // the descriptor's limit changed by a reload (xDS)
				tk := &res.takes[len(res.takes)-1]
				tk.Was = e.wasFor(nil, c.r, c.r, tk.Key, time.Now())
			}
			res.idx = append(res.idx, j)
		}
		if len(res.takes) == 0 {
			continue
		}
		// A usage report is answered by a look at its key once charged,
		// in the same call: over the limit if the charge put it in debt.
		looks := 0
		if g.usage {
			looks = len(res.takes)
			for k := range looks {
				look := res.takes[k]
				look.Cost, look.Charge = 0, false
				res.takes = append(res.takes, look)
			}
		}
		decs := res.decisions(len(res.takes))
		err := e.client.Take(ctx, storecall.Call{Owing: true, Wait: wait, Spent: &res.StoreTime}, res.takes, decs)
		for k, j := range res.idx {
			c := list[j]
			st := &res.Statuses[c.i]
			st.r, st.key, st.Shadow = c.r, res.takes[k].Key, g.shadow
			switch {
			case err == nil && g.usage:
				st.Decision = decs[looks+k]
				st.taken = c.cost
				e.follow(ctx, res, c.r, c.limit, &res.takes[k], &decs[looks+k])
			case err == nil:
				st.Decision = decs[k]
				if c.cost > 0 && !res.takes[k].DryRun {
					if st.Allowed {
						st.taken = c.cost
					}
					if !g.shadow {
						e.follow(ctx, res, c.r, c.limit, &res.takes[k], &decs[k])
					}
				}
			case g.shadow:
				st.Decision = sluice.Decision{Rule: c.r.ID, Limit: c.limit, Allowed: true}
			case g.usage:
				// Spent all the same: charged to the share (and owed),
				// then answered by a look at it.
				if !c.r.FailClosed {
					e.fallbackTake(ctx, c.r, c.limit, res.takes[k])
				}
				st.Decision, st.FailedClosed = e.failMode(ctx, c.r, c.limit, res.takes[looks+k])
				st.FailedOpen = !st.FailedClosed
			default:
				st.Decision, st.FailedClosed = e.failMode(ctx, c.r, c.limit, res.takes[k])
				st.FailedOpen = !st.FailedClosed
			}
			st.Decision.Rule, st.Decision.Limit = c.r.ID, c.limit
			if !g.shadow && !g.quota && !st.Allowed {
				plainRefused = true
			}
		}
		if err != nil && !g.shadow {
			res.StoreError = err
		}
	}
	return nil
}

// combineDescriptors decides the request: quota descriptors decide only
// together, so it is over when a plain descriptor is, or when every quota
// descriptor is.
func combineDescriptors(res *Result) {
	res.combine()
	quotas, quotasOver, plainOver := 0, 0, false
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.r == nil || st.Shadow {
			continue
		}
		switch {
		case st.r.Envoy.QuotaMode:
			quotas++
			if !st.Allowed {
				quotasOver++
			}
		case !st.Allowed:
			plainOver = true
		}
	}
	res.Allowed = !plainOver && (quotas == 0 || quotasOver < quotas)
	for i := range res.Statuses {
		if res.Statuses[i].r != nil && !res.Statuses[i].r.Envoy.Deny {
			res.Statuses[i].count(res.Allowed)
		}
	}
}

// replacesItself guards against a rule listed in its own replaces.
func replacesItself(r *rule) bool {
	for _, n := range r.Envoy.Replaces {
		if n == r.Envoy.Name {
			return true
		}
	}
	return false
}

// ServesDomain reports whether any rule answers descriptors of domain.
func (e *Engine) ServesDomain(domain string) bool {
	_, ok := e.set.Load().envoy[domain]
	return ok
}

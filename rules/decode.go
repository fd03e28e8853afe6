package rules

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	goccyyaml "github.com/goccy/go-yaml"
	goccyparser "github.com/goccy/go-yaml/parser"

	"github.com/sluice-rl/sluice"
	"go.yaml.in/yaml/v3"
)

// decoder walks the YAML node tree (JSON parses as YAML too), so that every
// value keeps its line and column, and collects every fault instead of
// stopping at the first.
type decoder struct {
	file  string
	errs  Errors
	paths PathOptions // from the paths section, applied to rule patterns
}

// pattern parses a rule's path pattern in the normal form of the file's
// paths section, so that it matches the paths it is written for.
func (d *decoder) pattern(s string) (*Pattern, error) {
	n, ok := d.paths.Normalize(s)
	if !ok {
		return nil, fmt.Errorf("path pattern %q holds what the paths section refuses in a path (an encoded slash or backslash, or a ;)", s)
	}
	return ParsePattern(d.paths.MatchForm(n))
}

func (d *decoder) fail(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: d.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

// fields walks a mapping, calling the handler of each known key and
// reporting unknown and repeated ones.
func (d *decoder) fields(n *yaml.Node, field string, known map[string]func(v *yaml.Node, field string)) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, field, "want a mapping, got %s", describe(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		sub := k.Value
		if field != "" {
			sub = field + "." + k.Value
		}
		h, ok := known[k.Value]
		switch {
		case !ok:
			names := make([]string, 0, len(known))
			for name := range known {
				names = append(names, name)
			}
			slices.Sort(names)
			d.fail(k, sub, "unknown field %q (known: %s)", k.Value, strings.Join(names, ", "))
		case seen[k.Value]:
			d.fail(k, sub, "field given twice")
		default:
			seen[k.Value] = true
			h(v, sub)
		}
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}

func (d *decoder) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		d.fail(n, field, "want a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) integer(n *yaml.Node, field string) (int64, bool) {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, field, "want an integer, got %s", describe(n))
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		if num, per, ok := strings.Cut(n.Value, "/"); ok && strings.HasSuffix(field, "rate") {
			// "rate: 100/m": the limit written as sluice.ParseLimit takes it.
			if _, e := strconv.ParseInt(strings.TrimSpace(num), 10, 64); e == nil {
				d.fail(n, field, "want an integer, got %q: write rate: %s and per: %s", n.Value, strings.TrimSpace(num), periodHint(strings.TrimSpace(per)))
				return 0, false
			}
		}
		d.fail(n, field, "want an integer, got %q", n.Value)
		return 0, false
	}
	return v, true
}

// periodHint writes a period as per: takes it ("m" is "1m").
func periodHint(p string) string {
	if p != "" && (p[0] < '0' || p[0] > '9') {
		return "1" + p
	}
	return p
}

func (d *decoder) boolean(n *yaml.Node, field string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "true":
			return true, true
		case "false":
			return false, true
		}
	}
	d.fail(n, field, "want true or false, got %s", describe(n))
	return false, false
}

// Bounds of a rule's onSlowStore: wait.
const (
	DefaultSlowStoreWait = 2 * time.Second
	MaxSlowStoreWait     = 10 * time.Second
)

// slowStore reads onSlowStore: share (0), wait (DefaultSlowStoreWait) or
// {wait: DURATION}.
func (d *decoder) slowStore(n *yaml.Node, field string) time.Duration {
	if n.Kind == yaml.MappingNode {
		wait := DefaultSlowStoreWait
		d.fields(n, field, map[string]func(*yaml.Node, string){
			"wait": func(v *yaml.Node, f string) {
				if p, ok := d.period(v, f); ok {
					if p > MaxSlowStoreWait {
						d.fail(v, f, "at most %v, got %v", MaxSlowStoreWait, p)
					}
					wait = p
				}
			},
		})
		return wait
	}
	s, ok := d.str(n, field)
	switch {
	case !ok:
	case s == "share":
	case s == "wait":
		return DefaultSlowStoreWait
	default:
		d.fail(n, field, "want share (the default: answered from the gateway's share at the store's deadline), wait (up to %v for a slow store) or {wait: DURATION}, got %q", DefaultSlowStoreWait, s)
	}
	return 0
}

func (d *decoder) period(n *yaml.Node, field string) (time.Duration, bool) {
	s, ok := d.str(n, field)
	if !ok {
		return 0, false
	}
	p, err := sluice.ParsePeriod(s)
	if err != nil {
		d.fail(n, field, "%v", err)
		return 0, false
	}
	return p, true
}

// strings accepts one string or a list of them.
func (d *decoder) strings(n *yaml.Node, field string) ([]string, []*yaml.Node) {
	if n.Kind == yaml.SequenceNode {
		var out []string
		var nodes []*yaml.Node
		for i, item := range n.Content {
			if s, ok := d.str(item, fmt.Sprintf("%s[%d]", field, i)); ok {
				out = append(out, s)
				nodes = append(nodes, item)
			}
		}
		if len(n.Content) == 0 {
			d.fail(n, field, "empty list")
		}
		return out, nodes
	}
	if s, ok := d.str(n, field); ok {
		return []string{s}, []*yaml.Node{n}
	}
	return nil, nil
}

func (d *decoder) config(data []byte) *Config {
	c := &Config{File: d.file, Sources: defaultSources(), IPv6Prefix: DefaultIPv6Prefix}
	if enc := unmarkedUTF16(data); enc != "" {
		d.errs = append(d.errs, &Error{File: d.file, Msg: "the file is " + enc + " without a byte order mark; save it as UTF-8 (or UTF-16 with a BOM)"})
		return nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		d.errs = append(d.errs, syntaxError(d.file, data, err))
		return nil
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		d.fail(nil, "", "the file is empty; want a mapping with a rules list")
		return nil
	}
	root := doc.Content[0]
	if isEnvoyFile(root) {
		d.envoyFile(c, root)
		return c
	}
	var rulesNode, priorityNode *yaml.Node
	allowNone := false
	d.fields(root, "", map[string]func(*yaml.Node, string){
		"keys": func(v *yaml.Node, f string) { d.keys(c, v, f) },
		"trustedProxies": func(v *yaml.Node, f string) {
			items, nodes := d.strings(v, f)
			for i, s := range items {
				p, err := parsePrefix(s)
				if err != nil {
					d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%q is not an IP address or CIDR prefix", s)
					continue
				}
				c.TrustedProxies = append(c.TrustedProxies, p)
			}
		},
		"ipv6Prefix": func(v *yaml.Node, f string) {
			if n, ok := d.integer(v, f); ok {
				if n < 1 || n > 128 {
					d.fail(v, f, "must be between 1 and 128, got %d", n)
				}
				c.IPv6Prefix = int(n)
			}
		},
		"clientIP": func(v *yaml.Node, f string) {
			d.fields(v, f, map[string]func(*yaml.Node, string){
				"depth": func(v *yaml.Node, f string) {
					if n, ok := d.integer(v, f); ok {
						if n < 1 || n > 64 {
							d.fail(v, f, "must be between 1 and 64, got %d", n)
						}
						c.ClientIPDepth = int(n)
					}
				},
			})
		},
		"paths": func(v *yaml.Node, f string) {
			d.fields(v, f, map[string]func(*yaml.Node, string){
				"trailingSlash": func(v *yaml.Node, f string) {
					if s, ok := d.str(v, f); ok {
						switch s {
						case "ignore":
							c.Paths.KeepTrailingSlash = false
						case "keep":
							c.Paths.KeepTrailingSlash = true
						default:
							d.fail(v, f, "want ignore (the default: /otp/ is /otp) or keep, got %q", s)
						}
					}
				},
				"caseInsensitive": func(v *yaml.Node, f string) {
					if b, ok := d.boolean(v, f); ok {
						c.Paths.CaseSensitive = !b
					}
				},
				"encodedSlashes": func(v *yaml.Node, f string) {
					if s, ok := d.str(v, f); ok {
						switch s {
						case "reject":
							c.Paths.DecodeSeparators = false
						case "decode":
							c.Paths.DecodeSeparators = true
						default:
							d.fail(v, f, "want reject (the default: a path with %%2F, %%5C or a backslash gets 400) or decode (read each as /), got %q", s)
						}
					}
				},
				"params": func(v *yaml.Node, f string) {
					if s, ok := d.str(v, f); ok {
						switch s {
						case "strip":
							c.Paths.Params = ParamsStrip
						case "keep":
							c.Paths.Params = ParamsKeep
						case "reject":
							c.Paths.Params = ParamsReject
						default:
							d.fail(v, f, "want strip (the default: /otp;a=b is /otp), keep (; is an ordinary character) or reject (400), got %q", s)
						}
					}
				},
			})
			d.paths = c.Paths
		},
		"rules":        func(v *yaml.Node, f string) { rulesNode = v },
		"priority":     func(v *yaml.Node, f string) { priorityNode = v },
		"allowNoRules": func(v *yaml.Node, f string) { allowNone, _ = d.boolean(v, f) },
	})
	if root.Kind != yaml.MappingNode {
		return nil
	}
	if rulesNode == nil {
		d.fail(root, "rules", "missing: a rule file needs a rules list")
		return c
	}
	// The priority section and the rules come last, so that every named
	// key source is known.
	if priorityNode != nil {
		c.Priority = d.priority(c, priorityNode, "priority")
	}
	if rulesNode.Kind != yaml.SequenceNode {
		d.fail(rulesNode, "rules", "want a list, got %s", describe(rulesNode))
		return c
	}
	if len(rulesNode.Content) == 0 && !allowNone {
		// A file emptied by mistake (or by a bad template) would let every
		// request through on the next reload.
		d.fail(rulesNode, "rules", "empty: with no rules every request passes; write allowNoRules: true if that is meant")
		return c
	}
	ids := map[string]int{}
	for i, rn := range rulesNode.Content {
		field := fmt.Sprintf("rules[%d]", i)
		r := d.rule(c, rn, field)
		if r == nil {
			continue
		}
		more := d.overrides(r) // first: r then exempts the override's keys, windows included
		more = append(more, d.windows(r, field)...)
		for _, x := range append([]*Rule{r}, more...) {
			if line, dup := ids[x.ID]; dup && x.ID != "" {
				d.fail(rn, field+".id", "duplicate id %q (first at line %d)", x.ID, line)
			}
			ids[x.ID] = rn.Line
			c.Rules = append(c.Rules, x)
		}
	}
	for _, r := range c.Rules {
		if r.Tiers != nil {
			r.levels = DefaultLevels
			if c.Priority != nil {
				r.levels = c.Priority.Levels
			}
		}
	}
	return c
}

// override is a limit of a rule for some key values (its overrides list).
type override struct {
	values []ValueSet
	limit  sluice.Limit // unset fields: the rule's
	node   *yaml.Node
	field  string
}

// overrides returns the rules of r's overrides, and takes their values out
// of r (and of its windows): rule "per-key" with an override for partner
// keys becomes "per-key", which exempts them, and "per-key.override-1",
// which applies only to them, with the override's rate, period and burst
// (the rule's where unset). A key has one count per limit, as in every
// other change of limit: an override starts its keys fresh.
func (d *decoder) overrides(r *Rule) []*Rule {
	var out []*Rule
	for i, o := range r.overrides {
		x := *r
		x.overrides, x.also = nil, nil
		x.ID = fmt.Sprintf("%s.override-%d", r.ID, i+1)
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
			d.fail(o.node, o.field, "cost %d is more than the override's burst %d: no request could ever pass", x.Cost, l.Capacity())
			continue
		}
		x.Limit, x.Fallback = l, l
		out = append(out, &x)
	}
	for _, o := range r.overrides {
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
		x.also, x.overrides = nil, nil
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

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

func (d *decoder) keys(c *Config, n *yaml.Node, field string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, field, "want a mapping of key source names, got %s", describe(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + k.Value
		if _, builtin := builtinSources[k.Value]; builtin || strings.Contains(k.Value, ":") || k.Value == "" {
			d.fail(k, f, "%q cannot name a key source: it is built in or contains ':'", k.Value)
			continue
		}
		s := &Source{Name: k.Value}
		kinds := 0
		set := func(kind SourceKind) func(*yaml.Node, string) {
			return func(v *yaml.Node, f string) {
				if p, ok := d.str(v, f); ok {
					if p == "" {
						d.fail(v, f, "empty name")
					}
					s.Kind, s.Param = kind, p
					if kind == FromHeader {
						s.Param = http.CanonicalHeaderKey(p)
					}
					kinds++
				}
			}
		}
		d.fields(v, f, map[string]func(*yaml.Node, string){
			"header": set(FromHeader),
			"query":  set(FromQuery),
			"cookie": set(FromCookie),
			"body":   set(FromBody),
			"scheme": func(v *yaml.Node, f string) { s.Scheme, _ = d.str(v, f) },
			"hash":   func(v *yaml.Node, f string) { s.Hash, _ = d.boolean(v, f) },
			"normalize": func(v *yaml.Node, f string) {
				names, nodes := d.strings(v, f)
				for i, name := range names {
					n, ok := normalizations[name]
					if !ok {
						d.fail(nodes[i], f, "unknown normalization %q (want trim, lower or digits)", name)
					}
					s.Normalize |= n
				}
			},
		})
		switch {
		case kinds == 0 && v.Kind == yaml.MappingNode:
			d.fail(v, f, "name where the key comes from: one of header, query, cookie or body")
		case kinds > 1:
			d.fail(v, f, "give only one of header, query, cookie or body")
		case s.Scheme != "" && s.Kind != FromHeader:
			d.fail(v, f+".scheme", "scheme applies only to a header")
		}
		c.Sources[k.Value] = s
	}
}

func (d *decoder) rule(c *Config, n *yaml.Node, field string) *Rule {
	r := &Rule{Cost: 1, Line: n.Line}
	var rateNode, perNode, burstNode, costNode *yaml.Node
	var fallback struct {
		rate, burst int64
		per         time.Duration
		node        *yaml.Node
	}
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"id": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				if !validID(s) {
					d.fail(v, f, "%q: an id is 1-64 letters, digits, '-', '_' or '.'", s)
				}
				r.ID = s
			}
		},
		"match":  func(v *yaml.Node, f string) { d.match(c, &r.Match, v, f) },
		"exempt": func(v *yaml.Node, f string) { r.Exempt = d.valueSets(c, v, f) },
		"key": func(v *yaml.Node, f string) {
			names, nodes := d.strings(v, f)
			for i, name := range names {
				s, err := c.source(name)
				if err != nil {
					d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%v", err)
					continue
				}
				r.Key = append(r.Key, s)
			}
		},
		"rate": func(v *yaml.Node, f string) {
			rateNode = v
			if x, ok := d.integer(v, f); ok {
				if x <= 0 {
					d.fail(v, f, "must be > 0, got %d", x)
				}
				r.Limit.Rate = x
			}
		},
		"per": func(v *yaml.Node, f string) {
			perNode = v
			r.Limit.Period, _ = d.period(v, f)
		},
		"burst": func(v *yaml.Node, f string) {
			burstNode = v
			if x, ok := d.integer(v, f); ok {
				if x <= 0 {
					d.fail(v, f, "must be > 0, got %d", x)
				}
				r.Limit.Burst = x
			}
		},
		"algorithm": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				a, err := sluice.ParseAlgorithm(s)
				if err != nil {
					d.fail(v, f, "%s", strings.TrimPrefix(err.Error(), "sluice: "))
				}
				r.Limit.Algorithm = a
			}
		},
		"unit": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				if s == "" || len(s) > 32 || strings.ContainsFunc(s, func(c rune) bool { return !unicode.IsLetter(c) && c != ' ' && c != '-' }) {
					d.fail(v, f, "%q: want a word for what the rule counts, such as tokens (letters, at most 32)", s)
				}
				r.Unit = s
			}
		},
		"cost": func(v *yaml.Node, f string) {
			costNode = v
			if x, ok := d.integer(v, f); ok {
				if x <= 0 {
					d.fail(v, f, "must be > 0, got %d", x)
				}
				r.Cost = x
			}
		},
		"mode": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				switch s {
				case "enforce":
				case "shadow":
					r.Shadow = true
				default:
					d.fail(v, f, "want enforce or shadow, got %q", s)
				}
			}
		},
		"failMode": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				switch s {
				case "open":
				case "closed":
					r.FailClosed = true
				default:
					d.fail(v, f, "want open or closed, got %q", s)
				}
			}
		},
		"onSlowStore": func(v *yaml.Node, f string) {
			r.SlowStoreWait = d.slowStore(v, f)
		},
		"onMissingKey": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				switch s {
				case "fallback":
					r.MissingKey = MissingFallback
				case "reject":
					r.MissingKey = MissingReject
				case "skip":
					r.MissingKey = MissingSkip
				default:
					d.fail(v, f, "want fallback (the default: counted under fallbackKey, the client address unless set), reject (400) or skip (not counted by this rule), got %q", s)
				}
			}
		},
		"fallbackKey": func(v *yaml.Node, f string) {
			names, nodes := d.strings(v, f)
			for i, name := range names {
				s, err := c.source(name)
				if err != nil {
					d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%v", err)
					continue
				}
				r.FallbackKey = append(r.FallbackKey, s)
			}
		},
		"countOn": func(v *yaml.Node, f string) {
			d.fields(v, f, map[string]func(*yaml.Node, string){
				"status": func(v *yaml.Node, f string) {
					items := []*yaml.Node{v}
					if v.Kind == yaml.SequenceNode {
						items = v.Content
					}
					for i, item := range items {
						if x, ok := d.integer(item, fmt.Sprintf("%s[%d]", f, i)); ok {
							if x < 100 || x > 599 {
								d.fail(item, fmt.Sprintf("%s[%d]", f, i), "%d is not an HTTP status", x)
							}
							r.CountOn = append(r.CountOn, int(x))
						}
					}
				},
			})
			if len(r.CountOn) == 0 {
				d.fail(v, f+".status", "list the response statuses that count")
			}
		},
		"reserve":  func(v *yaml.Node, f string) { r.Reserve = d.reserve(v, f) },
		"tiers":    func(v *yaml.Node, f string) { r.Tiers = d.tiers(c, v, f) },
		"adaptive": func(v *yaml.Node, f string) { r.Adaptive, _ = d.boolean(v, f) },
		"sync":     func(v *yaml.Node, f string) { d.sharing(&r.Sync, v, f) },
		"regions":  func(v *yaml.Node, f string) { r.Regions = d.regions(v, f) },
		"showKeys": func(v *yaml.Node, f string) { r.ShowKeys, _ = d.boolean(v, f) },
		"penalty": func(v *yaml.Node, f string) {
			p := &Penalty{}
			d.fields(v, f, map[string]func(*yaml.Node, string){
				"after": func(v *yaml.Node, f string) {
					if x, ok := d.integer(v, f); ok {
						if x <= 0 {
							d.fail(v, f, "must be > 0, got %d", x)
						}
						p.After = x
					}
				},
				"block": func(v *yaml.Node, f string) { p.Block, _ = d.period(v, f) },
			})
			if p.After == 0 || p.Block == 0 {
				d.fail(v, f, "give both after (rejections) and block (a period such as 15m)")
			}
			r.Penalty = p
		},
		"envoy": func(v *yaml.Node, f string) {
			m := &EnvoyMatch{}
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
			r.Envoy = m
		},
		"overrides": func(v *yaml.Node, f string) {
			d.each(v, f, "a list such as [{values: {api_key: [K]}, rate: 1000}]", func(item *yaml.Node, of string) {
				o := override{node: item, field: of}
				d.fields(item, of, map[string]func(*yaml.Node, string){
					"values": func(v *yaml.Node, f string) { o.values = d.valueSets(c, v, f) },
					"rate":   func(v *yaml.Node, f string) { o.limit.Rate, _ = d.integer(v, f) },
					"per":    func(v *yaml.Node, f string) { o.limit.Period, _ = d.period(v, f) },
					"burst":  func(v *yaml.Node, f string) { o.limit.Burst, _ = d.integer(v, f) },
				})
				if len(o.values) == 0 {
					d.fail(item, of+".values", "missing: the key values the override is for, such as {api_key: [K]}")
					return
				}
				r.overrides = append(r.overrides, o)
			})
		},
		"calendar": func(v *yaml.Node, f string) { r.Limit.Calendar, _ = d.boolean(v, f) },
		"also": func(v *yaml.Node, f string) {
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
				r.also = append(r.also, w)
			})
		},
		"fallback": func(v *yaml.Node, f string) {
			fallback.node = v
			d.fields(v, f, map[string]func(*yaml.Node, string){
				"rate": func(v *yaml.Node, f string) {
					if x, ok := d.integer(v, f); ok {
						fallback.rate = x
					}
				},
				"per":   func(v *yaml.Node, f string) { fallback.per, _ = d.period(v, f) },
				"burst": func(v *yaml.Node, f string) { fallback.burst, _ = d.integer(v, f) },
			})
		},
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
	if rateNode == nil {
		d.fail(n, field+".rate", "missing")
	}
	if perNode == nil {
		d.fail(n, field+".per", "missing: a period such as 1s, 1m, 15m, 1h or 1d")
	}
	if r.Limit.Rate > 0 && r.Limit.Period > 0 && r.Limit.Burst >= 0 {
		if err := r.Limit.Validate(); err != nil {
			at := burstNode
			if at == nil {
				at = rateNode
			}
			d.fail(at, field, "%s", strings.TrimPrefix(err.Error(), "invalid limit: "))
		} else if r.Cost > r.Limit.Capacity() {
			d.fail(costNode, field+".cost", "cost %d is more than the burst %d: no request could ever pass", r.Cost, r.Limit.Capacity())
		}
	}
	r.Fallback = r.Limit
	if fallback.node != nil {
		fb := sluice.Limit{Rate: fallback.rate, Period: fallback.per, Burst: fallback.burst, Algorithm: sluice.GCRA}
		if fb.Period == 0 {
			fb.Period = r.Limit.Period
		}
		if err := fb.Validate(); err != nil {
			d.fail(fallback.node, field+".fallback", "%s", strings.TrimPrefix(err.Error(), "invalid limit: "))
		}
		r.Fallback, r.FallbackSet = fb, true
	}
	for i := range r.also {
		if !r.also[i].algoSet { // unset: the rule's algorithm
			r.also[i].limit.Algorithm = r.Limit.Algorithm
		}
	}
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
		case r.Limit.Rate > 0 && r.Limit.Period > 0 && r.Limit.Validate() == nil && rv.Estimate > r.Limit.Capacity():
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
		case r.Limit.Rate > 0 && r.Limit.Period > 0 && r.Limit.Validate() == nil && AdaptiveLimit(r.Limit).Validate() != nil:
			d.fail(n, field+".adaptive", "%d per %v is too fine to shrink in steps of 1/%d", r.Limit.Rate, r.Limit.Period, AdaptiveScale)
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
	return r
}

// priority decodes the priority section.
func (d *decoder) priority(c *Config, n *yaml.Node, field string) *Priority {
	p := &Priority{Levels: DefaultLevels, Default: -1}
	var defNode *yaml.Node
	var def string
	var routes *yaml.Node
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"levels": func(v *yaml.Node, f string) {
			names, nodes := d.strings(v, f)
			seen := map[string]bool{}
			for i, s := range names {
				if !validID(s) || seen[strings.ToLower(s)] {
					d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%q: a level is 1-64 letters, digits, '-', '_' or '.', once", s)
				}
				seen[strings.ToLower(s)] = true
			}
			if len(names) < 2 || len(names) > MaxLevels {
				d.fail(v, f, "name 2 to %d levels, highest first", MaxLevels)
			}
			p.Levels = names
		},
		"from": func(v *yaml.Node, f string) {
			if name, ok := d.str(v, f); ok {
				s, err := c.source(name)
				if err != nil {
					d.fail(v, f, "%v", err)
					return
				}
				p.Source = s
			}
		},
		"routes":  func(v *yaml.Node, f string) { routes = v },
		"default": func(v *yaml.Node, f string) { defNode = v; def, _ = d.str(v, f) },
	})
	level := func(v *yaml.Node, f, name string) int {
		for i, l := range p.Levels {
			if strings.EqualFold(l, name) {
				return i
			}
		}
		d.fail(v, f, "%q is not one of the levels %v", name, p.Levels)
		return 0
	}
	if defNode != nil {
		p.Default = level(defNode, field+".default", def)
	} else if p.Default = slices.Index(p.Levels, "default"); p.Default < 0 {
		p.Default = len(p.Levels) - 1 // no level named default: the lowest
	}
	if routes != nil {
		if routes.Kind != yaml.MappingNode {
			d.fail(routes, field+".routes", "want a mapping of path patterns to levels, got %s", describe(routes))
		} else {
			for i := 0; i+1 < len(routes.Content); i += 2 {
				k, v := routes.Content[i], routes.Content[i+1]
				f := field + ".routes." + k.Value
				pat, err := d.pattern(k.Value)
				if err != nil {
					d.fail(k, f, "%v", err)
					continue
				}
				p.Routes = append(p.Routes, PriorityRoute{Pattern: pat, Level: level(v, f, v.Value)})
			}
		}
	}
	if p.Source == nil && len(p.Routes) == 0 {
		d.fail(n, field, "say where a request's tier comes from: from (a key source such as header:X-Priority), routes, or both")
	}
	return p
}

// tiers decodes a rule's shares per tier: level name to a percentage of the
// limit kept for it, such as {critical: 20%, default: 30%}.
func (d *decoder) tiers(c *Config, n *yaml.Node, field string) Tiers {
	if c.Priority == nil {
		d.fail(n, field, "tiers need a priority section saying where a request's tier comes from")
		return nil
	}
	shares := d.shares(n, field, "level", "critical: 20%")
	t := make(Tiers, len(c.Priority.Levels))
	for name, x := range shares {
		i := slices.IndexFunc(c.Priority.Levels, func(l string) bool { return strings.EqualFold(l, name) })
		if i < 0 {
			d.fail(n, field+"."+name, "%q is not one of the levels %v", name, c.Priority.Levels)
			continue
		}
		t[i] = x
	}
	return t
}

// reserve decodes a rule's reserve section.
func (d *decoder) reserve(v *yaml.Node, f string) *Reserve {
	rv := &Reserve{Deadline: DefaultReserveDeadline}
	d.fields(v, f, map[string]func(*yaml.Node, string){
		"estimate": func(v *yaml.Node, f string) {
			if x, ok := d.integer(v, f); ok {
				if x <= 0 {
					d.fail(v, f, "must be > 0, got %d", x)
				}
				rv.Estimate = x
			}
		},
		"estimateHeader": func(v *yaml.Node, f string) { rv.EstimateHeader = d.headerName(v, f) },
		"estimateBody": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				if s == "" {
					d.fail(v, f, "name a field of the request body, such as max_tokens")
				}
				rv.EstimateBody = s
			}
		},
		"actualHeader": func(v *yaml.Node, f string) { rv.ActualHeader = d.headerName(v, f) },
		"actualJSON": func(v *yaml.Node, f string) {
			if s, ok := d.str(v, f); ok {
				parts := strings.Split(s, ".")
				for _, p := range parts {
					if p == "" {
						d.fail(v, f, "want a dotted path to a number such as usage.total_tokens, got %q", s)
						return
					}
				}
				rv.ActualJSON = parts
			}
		},
		"deadline": func(v *yaml.Node, f string) {
			if p, ok := d.period(v, f); ok {
				if p > MaxReserveDeadline {
					d.fail(v, f, "at most %v, got %v", MaxReserveDeadline, p)
				}
				rv.Deadline = p
			}
		},
	})
	if rv.Estimate == 0 && !d.failedUnder(f+".estimate") {
		d.fail(v, f+".estimate", "missing: the units to reserve when a request names none")
	}
	if rv.ActualHeader != "" && rv.ActualJSON != nil {
		d.fail(v, f, "give actualHeader or actualJSON, not both")
	}
	return rv
}

// headerName decodes an HTTP header name.
func (d *decoder) headerName(v *yaml.Node, f string) string {
	s, ok := d.str(v, f)
	if !ok {
		return ""
	}
	if s == "" || strings.ContainsFunc(s, func(c rune) bool { return c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c) }) {
		d.fail(v, f, "%q is not an HTTP header name", s)
		return ""
	}
	return http.CanonicalHeaderKey(s)
}

func (d *decoder) failedUnder(field string) bool {
	for _, e := range d.errs {
		if strings.HasPrefix(e.Field, field) {
			return true
		}
	}
	return false
}

func validID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func (d *decoder) match(c *Config, m *Match, n *yaml.Node, field string) {
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"values": func(v *yaml.Node, f string) { m.Values = d.valueSets(c, v, f) },
		"method": func(v *yaml.Node, f string) {
			ms, nodes := d.strings(v, f)
			for i, s := range ms {
				u := strings.ToUpper(s)
				if !slices.Contains(knownMethods, u) {
					// A typo (GTE) would match nothing and limit nothing.
					field := f
					if v.Kind == yaml.SequenceNode {
						field = fmt.Sprintf("%s[%d]", f, i)
					}
					d.fail(nodes[i], field, "unknown method %q (want one of %s)", s, strings.Join(knownMethods, ", "))
					continue
				}
				m.Methods = append(m.Methods, u)
			}
		},
		"path": func(v *yaml.Node, f string) {
			ps, nodes := d.strings(v, f)
			for i, s := range ps {
				p, err := d.pattern(s)
				if err != nil {
					d.fail(nodes[i], fmt.Sprintf("%s[%d]", f, i), "%v", err)
					continue
				}
				m.Paths = append(m.Paths, p)
			}
		},
		"host": func(v *yaml.Node, f string) {
			hs, _ := d.strings(v, f)
			for _, s := range hs {
				m.Hosts = append(m.Hosts, strings.ToLower(s))
			}
		},
	})
}

// sharing reads a rule's sync setting: a mode name, or a mapping with mode,
// batch, interval, shards and hotAbove.
func (d *decoder) sharing(sh *sluice.Sharing, n *yaml.Node, field string) {
	mode := func(v *yaml.Node, f string) {
		if s, ok := d.str(v, f); ok {
			m, err := sluice.ParseSyncMode(s)
			if err != nil {
				d.fail(v, f, "%s", strings.TrimPrefix(err.Error(), "sluice: "))
			}
			sh.Mode = m
		}
	}
	if n.Kind == yaml.ScalarNode {
		mode(n, field)
		return
	}
	positive := func(v *yaml.Node, f string, max int64) int64 {
		x, ok := d.integer(v, f)
		if ok && (x < 1 || x > max) {
			d.fail(v, f, "must be between 1 and %d, got %d", max, x)
		}
		return x
	}
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"mode":     mode,
		"batch":    func(v *yaml.Node, f string) { sh.Batch = positive(v, f, 1<<20) },
		"shards":   func(v *yaml.Node, f string) { sh.Shards = int(positive(v, f, 64)) },
		"hotAbove": func(v *yaml.Node, f string) { sh.HotAbove = positive(v, f, 1<<30) },
		"interval": func(v *yaml.Node, f string) {
			if p, ok := d.period(v, f); ok {
				if p < time.Millisecond || p > time.Minute {
					d.fail(v, f, "must be between 1ms and 1m, got %v", p)
				}
				sh.Interval = p
			}
		},
	})
}

// regions reads a rule's regional shares: region name to a percentage of the
// limit, such as {eu: 50%, us: 30%}. The shares may not add up to more than
// 100%.
func (d *decoder) regions(n *yaml.Node, field string) map[string]float64 {
	return d.shares(n, field, "region", "eu: 50%")
}

// shares reads names (of what) to percentages adding up to at most 100%.
func (d *decoder) shares(n *yaml.Node, field, what, example string) map[string]float64 {
	if n.Kind != yaml.MappingNode {
		d.fail(n, field, "want a mapping of %s names to shares (%s), got %s", what, example, describe(n))
		return nil
	}
	out := map[string]float64{}
	total := 0.0
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + k.Value
		pct := strings.TrimSpace(strings.TrimSuffix(v.Value, "%"))
		x, err := strconv.ParseFloat(pct, 64)
		if v.Kind != yaml.ScalarNode || err != nil || x <= 0 || x > 100 {
			d.fail(v, f, "want a share between 0%% and 100%%, such as 50%%, got %q", v.Value)
			continue
		}
		if !validID(k.Value) {
			d.fail(k, f, "%q: a %s name is 1-64 letters, digits, '-', '_' or '.'", k.Value, what)
			continue
		}
		out[k.Value] = x / 100
		total += x
	}
	if total > 100+1e-9 {
		d.fail(n, field, "the shares add up to %.4g%%, more than 100%%", total)
	}
	return out
}

// knownMethods are the methods a rule may match: RFC 9110's, PATCH (RFC
// 5789) and WebDAV's (RFC 4918).
var knownMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
	"PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK"}

// syntaxError locates a YAML syntax error. go.yaml.in/yaml/v3 reports a
// parser error at the line before the one at fault, with no column (it
// prints a 0-based line for those); github.com/goccy/go-yaml's parser points
// at the offending token, so when it refuses the file too, its line, column
// and message are used.
func syntaxError(file string, data []byte, err error) *Error {
	e := &Error{File: file, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	if _, perr := goccyparser.ParseBytes(data, 0); perr != nil {
		var ye goccyyaml.Error
		if errors.As(perr, &ye) && ye.GetToken() != nil {
			p := ye.GetToken().Position
			e.Line, e.Column, e.Msg = p.Line, p.Column, ye.GetMessage()
		}
	}
	return e
}

// unmarkedUTF16 names the encoding of a file that is UTF-16 without a byte
// order mark (YAML needs the mark to tell), judged by the NUL bytes ASCII
// characters have in it; "" otherwise.
func unmarkedUTF16(data []byte) string {
	if len(data) < 4 || bytes.HasPrefix(data, []byte{0xfe, 0xff}) || bytes.HasPrefix(data, []byte{0xff, 0xfe}) {
		return ""
	}
	switch {
	case data[0] != 0 && data[1] == 0 && data[2] != 0 && data[3] == 0:
		return "UTF-16LE"
	case data[0] == 0 && data[1] != 0 && data[2] == 0 && data[3] != 0:
		return "UTF-16BE"
	}
	return ""
}

// each calls fn for every item of the list n, with the item's field name;
// anything but a non-empty list is a fault, and want says what was wanted.
func (d *decoder) each(n *yaml.Node, field, want string, fn func(item *yaml.Node, field string)) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		d.fail(n, field, "want %s", want)
		return
	}
	for i, item := range n.Content {
		fn(item, fmt.Sprintf("%s[%d]", field, i))
	}
}

// valueSets reads {source: [values...]}: the values of key sources, by the
// source's name (built in, inline or from keys); an ip source takes
// addresses and CIDR prefixes.
func (d *decoder) valueSets(c *Config, n *yaml.Node, field string) []ValueSet {
	if n.Kind != yaml.MappingNode || len(n.Content) == 0 {
		d.fail(n, field, "want {source: [values]}, such as {plan: [gold]} or {ip: [10.0.0.0/8]}")
		return nil
	}
	var out []ValueSet
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f := field + "." + k.Value
		src, err := c.source(k.Value)
		if err != nil {
			d.fail(k, f, "%v", err)
			continue
		}
		vals, nodes := d.strings(v, f)
		set := ValueSet{Source: src, Values: map[string]bool{}}
		for j, s := range vals {
			if src.Kind == FromIP {
				p, err := parsePrefix(s)
				if err != nil {
					d.fail(nodes[j], fmt.Sprintf("%s[%d]", f, j), "%q is not an IP address or CIDR prefix", s)
					continue
				}
				set.Prefixes = append(set.Prefixes, p)
				continue
			}
			set.Values[s] = true
		}
		out = append(out, set)
	}
	return out
}

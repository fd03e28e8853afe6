package rules

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
	"go.yaml.in/yaml/v3"
)

// EnvoyDescriptor makes a rule an Envoy descriptor rule: it applies to
// the descriptors of Envoy's rate limit service (gRPC) in Domain whose
// entries match Entries, one to one and in order, and never to plain HTTP
// requests. The rest is what envoyproxy/ratelimit's file says of a
// descriptor beside its limit.
type EnvoyDescriptor struct {
	Domain  string
	Entries []EnvoyEntry
	// Name is the limit's name for replaces (rate_limit.name); Replaces
	// names the limits this one replaces when both apply to one request;
	// Unlimited limits always allow and count nothing.
	Name      string
	Replaces  []string
	Unlimited bool
	// Whitelisted descriptors are never limited; Deny ones
	// (requests_per_unit: 0) are always over the limit; QuotaMode ones make
	// a response OVER_LIMIT only when every quota descriptor is over.
	Whitelisted, Deny, QuotaMode bool
	// Metadata is the descriptor's metadata, returned in the response's
	// dynamic metadata for descriptors that pass.
	Metadata map[string]any
	// StatsKey is the reference service's stats key of the descriptor, such
	// as "edge.api_key.path_/login"; DetailedMetric and ValueToMetric put
	// the request's values in it, as the reference does.
	StatsKey                      string
	DetailedMetric, ValueToMetric bool

	replacesNodes []*yaml.Node // where each replaces name was, while decoding
}

// EnvoyEntry matches one descriptor entry: Key exactly, and Value exactly,
// as a pattern when it holds "*" (each "*" matches any run of characters,
// empty included: "bar*b", "/api/*/action"), or any value when empty. Each
// distinct value gets its own count, unless Share (share_threshold) makes
// every value matching a pattern share one.
type EnvoyEntry struct {
	Key   string
	Value string
	Share bool
}

// Matches reports whether a descriptor entry's value matches, and how
// specifically: 3 exact, 2 wildcard (patterns are not ranked apart: the
// first in the file wins), 1 any value, 0 no match.
func (e EnvoyEntry) Matches(value string) int {
	switch {
	case e.Value == "":
		return 1
	case strings.Contains(e.Value, "*"):
		if globMatch(e.Value, value) {
			return 2
		}
		return 0
	case e.Value == value:
		return 3
	}
	return 0
}

// globMatch reports whether s matches pattern, each "*" of which matches
// any run of characters (empty included): the parts between the stars must
// appear in order, the first at the start and the last at the end.
func globMatch(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return len(s) >= len(last) && strings.HasSuffix(s, last)
}

// envoyUnits are the periods of envoyproxy/ratelimit's units; a month is 30
// days and a year 365, as the reference service counts them.
var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// EnvoyPeriod returns the period of an envoyproxy/ratelimit unit name.
func EnvoyPeriod(unit string) (time.Duration, bool) {
	d, ok := envoyUnits[strings.ToLower(unit)]
	return d, ok
}

// isEnvoyFile reports whether a document is in envoyproxy/ratelimit's format:
// its top level has domain or descriptors.
func isEnvoyFile(root *yaml.Node) bool {
	if root.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i < len(root.Content); i += 2 {
		if k := root.Content[i].Value; k == "domain" || k == "descriptors" {
			return true
		}
	}
	return false
}

// envoyFile reads envoyproxy/ratelimit's YAML as it is: a domain and nested
// descriptors, each with key, optional value (with * wildcards), optional
// rate_limit {unit, requests_per_unit, unlimited, name, replaces},
// shadow_mode, quota_mode, share_threshold, detailed_metric,
// value_to_metric and metadata. Every descriptor with a rate_limit becomes a
// fixed-window rule, as the reference service counts; one with neither a
// rate_limit nor nested descriptors is whitelisted (never limited).
func (d *decoder) envoyFile(c *Config, root *yaml.Node) {
	var domain string
	var line int
	var descs *yaml.Node
	d.fields(root, "", map[string]func(*yaml.Node, string){
		"domain":      func(v *yaml.Node, f string) { domain, _ = d.str(v, f); line = v.Line },
		"descriptors": func(v *yaml.Node, f string) { descs = v },
	})
	if domain == "" {
		d.fail(root, "domain", "missing: an envoyproxy/ratelimit file names its domain")
		return
	}
	c.EnvoyDomains = append(c.EnvoyDomains, domain)
	if c.domainLine == nil {
		c.domainLine = map[string]int{}
	}
	c.domainLine[domain] = line
	ids := map[string]bool{}
	if descs != nil && descs.Tag != "!!null" {
		d.envoyDescriptors(c, domain, nil, descs, "descriptors", ids)
	}
}

// MaxEnvoyDepth bounds how deeply descriptors nest. Envoy sends a few
// entries per descriptor; a file (or an xDS resource) nested thousands
// deep would cost memory in the square of its depth, each level's rules
// holding their whole path.
const MaxEnvoyDepth = 64

func (d *decoder) envoyDescriptors(c *Config, domain string, path []EnvoyEntry, n *yaml.Node, field string, ids map[string]bool) {
	if len(path) >= MaxEnvoyDepth {
		d.fail(n, field, "descriptors nested deeper than %d levels", MaxEnvoyDepth)
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, field, "want a list of descriptors, got %s", describe(n))
		return
	}
	seen := map[[2]string]int{} // key, value -> line: one level's entries are unique
	for i, item := range n.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		var entry EnvoyEntry
		var rl, children, keyNode, metadata *yaml.Node
		var opts envoyOptions
		d.fields(item, f, map[string]func(*yaml.Node, string){
			"key":             func(v *yaml.Node, f string) { entry.Key, _ = d.str(v, f); keyNode = v },
			"value":           func(v *yaml.Node, f string) { entry.Value, _ = d.str(v, f) },
			"rate_limit":      func(v *yaml.Node, f string) { rl = v },
			"descriptors":     func(v *yaml.Node, f string) { children = v },
			"shadow_mode":     func(v *yaml.Node, f string) { opts.shadow, _ = d.boolean(v, f) },
			"quota_mode":      func(v *yaml.Node, f string) { opts.quota, _ = d.boolean(v, f) },
			"share_threshold": func(v *yaml.Node, f string) { entry.Share, _ = d.boolean(v, f) },
			"detailed_metric": func(v *yaml.Node, f string) { opts.detailed, _ = d.boolean(v, f) },
			"value_to_metric": func(v *yaml.Node, f string) { opts.valueToMetric, _ = d.boolean(v, f) },
			"metadata":        func(v *yaml.Node, f string) { metadata = v },
		})
		if item.Kind != yaml.MappingNode {
			continue
		}
		if entry.Key == "" {
			d.fail(item, f+".key", "missing")
			continue
		}
		if entry.Share && !strings.Contains(entry.Value, "*") {
			d.fail(item, f+".share_threshold", "applies only to a value with a * wildcard, not %q", entry.Value)
		}
		k := [2]string{entry.Key, entry.Value}
		if line, dup := seen[k]; dup {
			d.fail(keyNode, f+".key", "duplicate descriptor key %q with value %q at this level (first at line %d)", entry.Key, entry.Value, line)
			continue
		}
		seen[k] = keyNode.Line
		here := append(append([]EnvoyEntry(nil), path...), entry)
		if metadata != nil {
			if err := metadata.Decode(&opts.metadata); err != nil || opts.metadata == nil {
				d.fail(metadata, f+".metadata", "want a mapping")
			}
		}
		switch {
		case rl != nil:
			if r := d.envoyRule(domain, here, rl, f+".rate_limit", opts, ids); r != nil {
				c.Rules = append(c.Rules, r)
			}
		case children == nil:
			// Neither a limit nor nested descriptors: whitelisted, so a more
			// general limit (a key without value) does not apply to it.
			r := &Rule{Cost: 1, Line: item.Line, Envoy: &EnvoyDescriptor{Domain: domain, Entries: here, Whitelisted: true, StatsKey: envoyStatsKey(domain, here)},
				Limit: sluice.Limit{Rate: 1, Period: time.Second, Algorithm: sluice.FixedWindow}}
			r.ID = envoyID(domain, here, "", ids)
			c.Rules = append(c.Rules, r)
		}
		if children != nil && children.Tag != "!!null" {
			d.envoyDescriptors(c, domain, here, children, f+".descriptors", ids)
		}
	}
}

// envoyOptions are a descriptor's flags besides its limit.
type envoyOptions struct {
	shadow, quota, detailed, valueToMetric bool
	metadata                               map[string]any
}

func (d *decoder) envoyRule(domain string, entries []EnvoyEntry, n *yaml.Node, field string, o envoyOptions, ids map[string]bool) *Rule {
	ed := &EnvoyDescriptor{Domain: domain, Entries: entries, QuotaMode: o.quota, Metadata: o.metadata,
		DetailedMetric: o.detailed, ValueToMetric: o.valueToMetric, StatsKey: envoyStatsKey(domain, entries)}
	r := &Rule{Cost: 1, Shadow: o.shadow, Line: n.Line, Envoy: ed}
	var unit string
	var unitNode *yaml.Node
	var perUnit int64
	perUnitSet := false
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"unit":              func(v *yaml.Node, f string) { unit, _ = d.str(v, f); unitNode = v },
		"requests_per_unit": func(v *yaml.Node, f string) { perUnit, perUnitSet = d.integer(v, f) },
		"unlimited":         func(v *yaml.Node, f string) { ed.Unlimited, _ = d.boolean(v, f) },
		"name":              func(v *yaml.Node, f string) { ed.Name, _ = d.str(v, f) },
		"replaces": func(v *yaml.Node, f string) {
			if v.Kind != yaml.SequenceNode {
				d.fail(v, f, "want a list of {name: ...}")
				return
			}
			for i, item := range v.Content {
				d.fields(item, fmt.Sprintf("%s[%d]", f, i), map[string]func(*yaml.Node, string){
					"name": func(v *yaml.Node, f string) {
						if s, ok := d.str(v, f); ok {
							if s == "" {
								d.fail(v, f, "empty: name the limit this one replaces")
							}
							ed.Replaces = append(ed.Replaces, s)
							ed.replacesNodes = append(ed.replacesNodes, v)
						}
					},
				})
			}
		},
	})
	for i, name := range ed.Replaces {
		if name != "" && name == ed.Name {
			d.fail(ed.replacesNodes[i], fmt.Sprintf("%s.replaces[%d].name", field, i), "a limit cannot replace itself (%q)", name)
		}
	}
	ed.replacesNodes = nil
	r.ID = envoyID(domain, entries, ed.Name, ids)
	if ed.Unlimited {
		if unitNode != nil {
			d.fail(unitNode, field+".unit", "an unlimited limit takes no unit")
		}
		r.Limit = sluice.Limit{Rate: 1, Period: time.Second, Algorithm: sluice.FixedWindow}
		return r
	}
	period, ok := EnvoyPeriod(unit)
	if !ok {
		at := unitNode
		if at == nil {
			at = n
		}
		d.fail(at, field+".unit", "unit %q: want second, minute, hour, day, week, month or year", unit)
		return nil
	}
	switch {
	case perUnitSet && perUnit == 0:
		// Zero requests per unit: always over the limit (a block list).
		ed.Deny = true
		r.Limit = sluice.Limit{Rate: 1, Period: period, Algorithm: sluice.FixedWindow}
		return r
	case perUnit < 0 || !perUnitSet:
		d.fail(n, field+".requests_per_unit", "must be >= 0, got %d", perUnit)
		return nil
	}
	r.Limit = sluice.Limit{Rate: perUnit, Period: period, Algorithm: sluice.FixedWindow}
	if err := r.Limit.Validate(); err != nil {
		d.fail(n, field, "%v", err)
		return nil
	}
	r.Fallback = r.Limit
	return r
}

// envoyStatsKey is the reference service's stats key of a descriptor path:
// the domain, then each entry as key or key_value (the pattern, for a
// wildcard), joined by dots.
func envoyStatsKey(domain string, entries []EnvoyEntry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// envoyID derives a valid rule id, unique in its file and namespaced by its
// domain (so files of both formats, and several domains, load together):
// the domain and the limit's name when it has one, else the domain and the
// entries, with characters outside [A-Za-z0-9._-] replaced.
func envoyID(domain string, entries []EnvoyEntry, name string, ids map[string]bool) string {
	var b strings.Builder
	b.WriteString(domain)
	if name != "" {
		b.WriteByte('.')
		b.WriteString(name)
	} else {
		for _, e := range entries {
			b.WriteByte('.')
			b.WriteString(e.Key)
			if e.Value != "" {
				b.WriteByte('_')
				b.WriteString(e.Value)
			}
		}
	}
	id := []byte(b.String())
	for i, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			id[i] = '_'
		}
	}
	s := string(id)
	if len(s) > 56 {
		s = s[:56]
	}
	base := s
	for n := 2; ids[s] || s == ""; n++ {
		s = base + "-" + strconv.Itoa(n)
	}
	ids[s] = true
	return s
}

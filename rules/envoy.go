package rules

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
	"go.yaml.in/yaml/v3"
)

// EnvoyMatch makes a rule an Envoy descriptor rule: it applies to the
// descriptors of Envoy's rate limit service (gRPC) in Domain whose entries
// match Entries, one to one and in order, and never to plain HTTP requests.
type EnvoyMatch struct {
	Domain  string
	Entries []EnvoyEntry
}

// EnvoyEntry matches one descriptor entry: Key exactly, and Value exactly,
// by prefix when it ends in "*", or any value when empty (each distinct
// value then gets its own count).
type EnvoyEntry struct {
	Key   string
	Value string
}

// Matches reports whether a descriptor entry's value matches, and how
// specifically: 3 exact, 2 wildcard (longer prefixes are not ranked apart),
// 1 any value, 0 no match.
func (e EnvoyEntry) Matches(value string) int {
	switch {
	case e.Value == "":
		return 1
	case strings.HasSuffix(e.Value, "*"):
		if strings.HasPrefix(value, strings.TrimSuffix(e.Value, "*")) {
			return 2
		}
		return 0
	case e.Value == value:
		return 3
	}
	return 0
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
// rate_limit {unit, requests_per_unit, unlimited, name, replaces} and
// shadow_mode. Every descriptor with a rate_limit becomes a fixed-window
// rule, as the reference service counts.
func (d *decoder) envoyFile(c *Config, root *yaml.Node) {
	var domain string
	var descs *yaml.Node
	d.fields(root, "", map[string]func(*yaml.Node, string){
		"domain":      func(v *yaml.Node, f string) { domain, _ = d.str(v, f) },
		"descriptors": func(v *yaml.Node, f string) { descs = v },
	})
	if domain == "" {
		d.fail(root, "domain", "missing: an envoyproxy/ratelimit file names its domain")
		return
	}
	ids := map[string]bool{}
	if descs != nil {
		d.envoyDescriptors(c, domain, nil, descs, "descriptors", ids)
	}
}

func (d *decoder) envoyDescriptors(c *Config, domain string, path []EnvoyEntry, n *yaml.Node, field string, ids map[string]bool) {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, field, "want a list of descriptors, got %s", describe(n))
		return
	}
	for i, item := range n.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		var entry EnvoyEntry
		var rl, children *yaml.Node
		shadow := false
		d.fields(item, f, map[string]func(*yaml.Node, string){
			"key":             func(v *yaml.Node, f string) { entry.Key, _ = d.str(v, f) },
			"value":           func(v *yaml.Node, f string) { entry.Value, _ = d.str(v, f) },
			"rate_limit":      func(v *yaml.Node, f string) { rl = v },
			"descriptors":     func(v *yaml.Node, f string) { children = v },
			"shadow_mode":     func(v *yaml.Node, f string) { shadow, _ = d.boolean(v, f) },
			"detailed_metric": func(v *yaml.Node, f string) { d.boolean(v, f) }, // metrics are per rule already
		})
		if item.Kind != yaml.MappingNode {
			continue
		}
		if entry.Key == "" {
			d.fail(item, f+".key", "missing")
			continue
		}
		here := append(append([]EnvoyEntry(nil), path...), entry)
		if rl != nil {
			if r := d.envoyRule(domain, here, rl, f+".rate_limit", shadow, ids); r != nil {
				c.Rules = append(c.Rules, r)
			}
		}
		if children != nil {
			d.envoyDescriptors(c, domain, here, children, f+".descriptors", ids)
		}
	}
}

func (d *decoder) envoyRule(domain string, entries []EnvoyEntry, n *yaml.Node, field string, shadow bool, ids map[string]bool) *Rule {
	r := &Rule{Cost: 1, Shadow: shadow, Line: n.Line, Envoy: &EnvoyMatch{Domain: domain, Entries: entries}}
	var unit string
	var perUnit int64
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"unit":              func(v *yaml.Node, f string) { unit, _ = d.str(v, f) },
		"requests_per_unit": func(v *yaml.Node, f string) { perUnit, _ = d.integer(v, f) },
		"unlimited":         func(v *yaml.Node, f string) { r.Unlimited, _ = d.boolean(v, f) },
		"name":              func(v *yaml.Node, f string) { r.Name, _ = d.str(v, f) },
		"replaces": func(v *yaml.Node, f string) {
			if v.Kind != yaml.SequenceNode {
				d.fail(v, f, "want a list of {name: ...}")
				return
			}
			for i, item := range v.Content {
				d.fields(item, fmt.Sprintf("%s[%d]", f, i), map[string]func(*yaml.Node, string){
					"name": func(v *yaml.Node, f string) {
						if s, ok := d.str(v, f); ok {
							r.Replaces = append(r.Replaces, s)
						}
					},
				})
			}
		},
	})
	r.ID = envoyID(domain, entries, r.Name, ids)
	if r.Unlimited {
		r.Limit = sluice.Limit{Rate: 1, Period: time.Second, Algorithm: sluice.FixedWindow}
		return r
	}
	period, ok := EnvoyPeriod(unit)
	if !ok {
		d.fail(n, field+".unit", "unit %q: want second, minute, hour, day, week, month or year", unit)
		return nil
	}
	if perUnit <= 0 {
		d.fail(n, field+".requests_per_unit", "must be > 0, got %d", perUnit)
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

// envoyID derives a valid, unique rule id: the limit's name when it has one,
// else the domain and the entries, with characters outside [A-Za-z0-9._-]
// replaced.
func envoyID(domain string, entries []EnvoyEntry, name string, ids map[string]bool) string {
	var b strings.Builder
	if name != "" {
		b.WriteString(name)
	} else {
		b.WriteString(domain)
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

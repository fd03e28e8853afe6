package rules

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
	"go.yaml.in/yaml/v3"
)

// The sections a rule holds beyond its limit (match, reserve, tiers, sync,
// regions) and the file's priority section, each decoded on its own.

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
		"estimate":       func(v *yaml.Node, f string) { rv.Estimate, _ = d.positive(v, f) },
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
		"path":    func(v *yaml.Node, f string) { m.Paths = d.patterns(v, f) },
		"notPath": func(v *yaml.Node, f string) { m.NotPaths = d.patterns(v, f) },
		"host": func(v *yaml.Node, f string) {
			hs, _ := d.strings(v, f)
			for _, s := range hs {
				m.Hosts = append(m.Hosts, strings.ToLower(s))
			}
		},
	})
}

// patterns reads one path pattern or a list of them.
func (d *decoder) patterns(n *yaml.Node, field string) []*Pattern {
	var out []*Pattern
	ps, nodes := d.strings(n, field)
	for i, s := range ps {
		p, err := d.pattern(s)
		if err != nil {
			d.fail(nodes[i], fmt.Sprintf("%s[%d]", field, i), "%v", err)
			continue
		}
		out = append(out, p)
	}
	return out
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

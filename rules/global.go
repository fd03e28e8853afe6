package rules

import (
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Global is a rule's global setting: one limit across regions, each region
// deciding on its own store on its part, the parts moving to where demand
// is through a home store every region reaches (package global).
type Global struct {
	// Own is each region's own share (thousandths of the limit): what it
	// holds of a key no exchange has moved, and falls back to when cut off.
	Own map[string]int64
	// Period is how often a region exchanges (default 1s).
	Period time.Duration
	// Lease is how long a share above a region's own lasts without a new
	// exchange (default 3s).
	Lease time.Duration
	// Borrow lets the regions' shares add up to more than the limit
	// (thousandths: 20 is 2%). Default 0: never over the limit.
	Borrow int64
}

// global decodes a rule's global setting:
//
//	global:
//	  regions: {eu: 40%, us: 40%, ap: 20%}
//	  period: 1s
//	  lease: 3s
//	  borrow: 0%
func (d *decoder) global(n *yaml.Node, field string) *Global {
	g := &Global{Period: time.Second, Lease: 3 * time.Second}
	d.fields(n, field, map[string]func(*yaml.Node, string){
		"regions": func(v *yaml.Node, f string) {
			g.Own = map[string]int64{}
			for name, x := range d.regions(v, f) {
				own := int64(math.Round(x * 1000))
				if own < 1 {
					d.fail(v, f+"."+name, "a region's own share is at least 0.1%%, got %.4g%%", x*100)
					continue
				}
				g.Own[name] = own
			}
		},
		"period": func(v *yaml.Node, f string) {
			if p, ok := d.period(v, f); ok {
				if p < 100*time.Millisecond || p > time.Minute {
					d.fail(v, f, "must be between 100ms and 1m, got %v", p)
				}
				g.Period = p
			}
		},
		"lease": func(v *yaml.Node, f string) {
			if p, ok := d.period(v, f); ok {
				if p > 10*time.Minute {
					d.fail(v, f, "must be at most 10m, got %v", p)
				}
				g.Lease = p
			}
		},
		"borrow": func(v *yaml.Node, f string) {
			pct := strings.TrimSpace(strings.TrimSuffix(v.Value, "%"))
			x, err := strconv.ParseFloat(pct, 64)
			if v.Kind != yaml.ScalarNode || err != nil || x < 0 || x > 10 {
				d.fail(v, f, "want a share of the limit between 0%% and 10%%, such as 2%%, got %q", v.Value)
				return
			}
			g.Borrow = int64(math.Round(x * 10))
		},
	})
	if n.Kind != yaml.MappingNode {
		return nil
	}
	total := int64(0)
	for _, own := range g.Own {
		total += own
	}
	if total > 1000 && !d.failedUnder(field+".regions") {
		d.fail(n, field+".regions", "the shares add up to %.1f%% once each is counted in tenths of a percent, more than 100%%", float64(total)/10)
	}
	if len(g.Own) == 0 && !d.failedUnder(field+".regions") {
		d.fail(n, field+".regions", "missing: name each region and its own share, such as {eu: 50%%, us: 50%%}")
	}
	if g.Lease < 2*g.Period {
		d.fail(n, field+".lease", "a lease of %v is shorter than two periods (%v): a region would lose its share between exchanges", g.Lease, 2*g.Period)
	}
	return g
}

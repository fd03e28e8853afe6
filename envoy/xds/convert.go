package xds

import (
	"encoding/json"
	"fmt"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluice-rl/sluice/rules"
)

// The envoyproxy/ratelimit file format, as rules reads it, for one
// RateLimitConfig resource: the resource is written out as the file it
// stands for and loaded as that file would be, so that xDS and files share
// one validation and one meaning. It is written as JSON, which rules reads
// as YAML: encoding/json writes a large snapshot in a fraction of the time
// and memory a YAML encoder takes, so that applying one costs about what
// loading its file does.
type fileJSON struct {
	Domain      string           `json:"domain"`
	Descriptors []descriptorJSON `json:"descriptors,omitempty"`
}

type descriptorJSON struct {
	Key            string           `json:"key"`
	Value          string           `json:"value,omitempty"`
	RateLimit      *limitJSON       `json:"rate_limit,omitempty"`
	Descriptors    []descriptorJSON `json:"descriptors,omitempty"`
	ShadowMode     bool             `json:"shadow_mode,omitempty"`
	DetailedMetric bool             `json:"detailed_metric,omitempty"`
	QuotaMode      bool             `json:"quota_mode,omitempty"`
	Metadata       map[string]any   `json:"metadata,omitempty"`
}

type limitJSON struct {
	Unit            string        `json:"unit,omitempty"`
	RequestsPerUnit *uint32       `json:"requests_per_unit,omitempty"`
	Unlimited       bool          `json:"unlimited,omitempty"`
	Name            string        `json:"name,omitempty"`
	Replaces        []replaceJSON `json:"replaces,omitempty"`
}

type replaceJSON struct {
	Name string `json:"name"`
}

// load reads one resource as a rule file named "xds:" and the resource's
// name (error positions are lines and columns of that JSON).
func load(c *rlsconf.RateLimitConfig) (*rules.Config, error) {
	if c.GetDomain() == "" {
		return nil, fmt.Errorf("xds:%s: domain: missing: a RateLimitConfig names its domain", c.GetName())
	}
	if depth(c.GetDescriptors()) > rules.MaxEnvoyDepth {
		// Refused before it is written out: the text of a deep nest grows
		// in the square of its depth (each level indented further).
		return nil, fmt.Errorf("xds:%s: descriptors nested deeper than %d levels", c.GetName(), rules.MaxEnvoyDepth)
	}
	b, err := json.MarshalIndent(fileJSON{Domain: c.GetDomain(), Descriptors: descriptors(c.GetDescriptors())}, "", " ")
	if err != nil {
		return nil, fmt.Errorf("xds:%s: %v", c.GetName(), err)
	}
	return rules.Parse("xds:"+c.GetName(), b)
}

func descriptors(ds []*rlsconf.RateLimitDescriptor) []descriptorJSON {
	out := make([]descriptorJSON, 0, len(ds))
	for _, d := range ds {
		y := descriptorJSON{
			Key: d.GetKey(), Value: d.GetValue(), Descriptors: descriptors(d.GetDescriptors()),
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(), QuotaMode: d.GetQuotaMode(),
		}
		if m := d.GetMetadata(); m != nil {
			y.Metadata = m.AsMap()
		}
		if p := d.GetRateLimit(); p != nil {
			l := &limitJSON{Unlimited: p.GetUnlimited(), Name: p.GetName()}
			if p.GetUnit() != rlsconf.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
				// UNKNOWN is written as it is and refused by the loader,
				// unless the limit is unlimited (which takes no unit).
				l.Unit = strings.ToLower(p.GetUnit().String())
			}
			if !p.GetUnlimited() {
				n := p.GetRequestsPerUnit() // proto3: 0 and unset are one; 0 is a block list
				l.RequestsPerUnit = &n
			}
			for _, r := range p.GetReplaces() {
				l.Replaces = append(l.Replaces, replaceJSON{Name: r.GetName()})
			}
			y.RateLimit = l
		}
		out = append(out, y)
	}
	return out
}

// depth is how deeply ds nest (1 for a flat list, 0 for none), without
// recursion, so that no nest can exhaust the stack.
func depth(ds []*rlsconf.RateLimitDescriptor) int {
	type level struct {
		ds []*rlsconf.RateLimitDescriptor
		d  int
	}
	deepest := 0
	stack := []level{{ds, 1}}
	for len(stack) > 0 {
		l := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if len(l.ds) == 0 {
			continue
		}
		deepest = max(deepest, l.d)
		if l.d > rules.MaxEnvoyDepth {
			return l.d
		}
		for _, d := range l.ds {
			stack = append(stack, level{d.GetDescriptors(), l.d + 1})
		}
	}
	return deepest
}

package engine

import (
	"sync/atomic"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
)

// ruleSet is a rules.Config compiled for evaluation.
type ruleSet struct {
	cfg   *rules.Config
	rules []*rule
	envoy map[string]*envoyNode // descriptor trees, by domain
}

type rule struct {
	*rules.Rule
	// store is the limit counted in the store: the rule's, or for an
	// adaptive rule the same in 1/rules.AdaptiveScale units.
	store                         sluice.Limit
	lockID, rejectsID, fallbackID string
	lockLimit, rejectsLimit       sluice.Limit
	stats                         *counters // shared by the rule's limit overrides
	// was is, for a limit override's rule, its base rule's own limit: what
	// a key counted under the override may have been counted under before
	// (carry.go).
	was []sluice.Limit
}

// unreported counts for the rules made for one request (an Envoy limit
// override), which no metric reports.
var unreported counters

func compile(cfg *rules.Config) *ruleSet {
	rs := &ruleSet{cfg: cfg}
	for _, r := range cfg.Rules {
		c := &rule{Rule: r, fallbackID: r.ID + "#fallback", store: r.Limit, stats: &counters{}}
		if r.Adaptive {
			c.store = rules.AdaptiveLimit(r.Limit)
		}
		if p := r.Penalty; p != nil {
			c.lockID, c.rejectsID = r.ID+"#lock", r.ID+"#rejections"
			c.lockLimit = sluice.Limit{Rate: 1, Period: p.Block, Burst: 1}
			c.rejectsLimit = sluice.Limit{Rate: p.After, Period: r.Limit.Period, Algorithm: sluice.SlidingLog}
			if p.After > sluice.MaxLogLimit {
				c.rejectsLimit.Algorithm = sluice.SlidingWindow
			}
		}
		rs.rules = append(rs.rules, c)
		if r.Envoy != nil {
			rs.addEnvoy(c)
		}
	}
	return rs
}

func (rs *ruleSet) find(id string) *rule {
	for _, r := range rs.rules {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// counters are one rule's outcome counts, for metrics.
type counters struct {
	allowed, limited, shadowLimited, failedOpen, failedClosed, skipped, locked, charged, nearLimit, overruled atomic.Uint64
	fellBack                                                                                                  atomic.Uint64
	settled, unsettled                                                                                        atomic.Uint64
	// Of a rule with tiers, the requests each tier had admitted and
	// refused (by level index).
	tierAllowed, tierLimited [rules.MaxLevels]atomic.Uint64
}

package main

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/global"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/redis"
)

// runGlobal starts this process's side of its region's global rules
// (--global-home): it pools the demand the share layer counts in the
// region's store and, while it leads the region, exchanges shares with
// the home (global.Runner). Without --global-home there is nothing to run:
// checkRegion has refused global rules.
func (c *common) runGlobal(s *setup, store sluice.Store, demand *global.Demand) error {
	if *c.globalHome == "" {
		return nil
	}
	if *c.region == "" {
		return errUsage{fmt.Errorf("--global-home needs --region: the region this process decides for")}
	}
	if *c.store == "memory" {
		// The embedded store is one process's: two processes of a region
		// would each hold the region's share, and neither would know.
		return errUsage{fmt.Errorf("--global-home needs --store redis://...: a region's processes share its Redis, where the region's part of each key lives")}
	}
	region, ok := store.(global.Region)
	if !ok {
		return fmt.Errorf("the store %s cannot hold a region's shares of a global limit", redactedURL(*c.store))
	}
	home, err := redis.New(redis.Options{URL: *c.globalHome, Prefix: *c.prefix, Lazy: true})
	if err != nil {
		return fmt.Errorf("--global-home: %w", err)
	}
	r := &global.Runner{
		Region: *c.region, ID: gatewayID(), Store: region, Home: home, Demand: demand,
		Rules: func() []global.Rule { return globalRules(s.eng.Config().Rules, *c.region) }, Logger: s.log,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	s.global = r
	s.metrics.WatchGlobal(r)
	// Stopped before the stores close; what it holds ends with its leases.
	s.closers = append([]func(){func() { cancel(); <-done; home.Close() }}, s.closers...)
	s.log.Info("sluice: moving the global rules' shares", "region", *c.region, "home", redactedURL(*c.globalHome))
	return nil
}

// globalRules are the global rules in force as region's agent exchanges
// them: each limit with the region's own share as its Portion, as the
// share layer takes it.
func globalRules(rs []*rules.Rule, region string) []global.Rule {
	var out []global.Rule
	for _, r := range rs {
		g := r.Global
		if g == nil || g.Own[region] == 0 {
			continue
		}
		l := r.Limit
		l.Portion = g.Own[region]
		out = append(out, global.Rule{ID: r.ID, Limit: l, Options: global.Options{
			Period: g.Period, LeaseFor: g.Lease, Borrow: g.Borrow, Own: g.Own,
		}})
	}
	return out
}

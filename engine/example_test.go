package engine_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// An engine holds a rule set over a store and decides requests: every
// rule a request matches takes from its key, all or nothing, and the
// answer names the deciding rule.
func Example() {
	cfg, err := rules.Parse("rules.yaml", []byte(`
rules:
  - id: per-ip
    key: [ip]
    rate: 5
    per: 1m
  - id: per-user
    key: [user]
    rate: 2
    per: 1m
`))
	if err != nil {
		panic(err)
	}
	store := memory.New()
	defer store.Close()
	e, err := engine.New(cfg, engine.Options{Store: store})
	if err != nil {
		panic(err)
	}
	req := &rules.Request{
		Method:   "GET",
		Path:     "/orders",
		ClientIP: netip.MustParseAddr("192.0.2.7"),
		Header:   http.Header{"X-User-Id": {"alice"}},
	}
	var res engine.Result
	for range 3 {
		if err := e.Check(context.Background(), req, engine.CheckOptions{}, &res); err != nil {
			panic(err)
		}
		fmt.Println(res.Allowed, res.Decision.Rule, res.Decision.Remaining)
	}
	// Output:
	// true per-user 1
	// true per-user 0
	// false per-user 0
}

package engine

import (
	"context"
	"net/http"
	"testing"
)

const tierRules = `
priority: {from: header:X-Priority}
rules:
  - {id: api, key: [ip], rate: 10, per: 1h, tiers: {critical: 20%, default: 30%}}
`

// A limit of 10 whose critical tier keeps 2 and default 3 from the tiers
// below: sheddable traffic takes 5 and no more, default 3 more, critical
// the last 2, whatever order they arrive in.
func TestTiersShedFromTheLowestUp(t *testing.T) {
	f := newFixture(t, tierRules, Options{})
	ask := func(tier string) bool {
		req := userReq("u")
		req.Header = http.Header{"X-Priority": {tier}}
		var res Result
		if err := f.e.Check(context.Background(), req, CheckOptions{}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Allowed
	}
	got := map[string]int{}
	for range 20 {
		for _, tier := range []string{"sheddable", "default", "critical"} {
			if ask(tier) {
				got[tier]++
			}
		}
	}
	// Interleaved: sheddable and default share the 5 above the default
	// floor; then default alone reaches its floor; critical takes the rest.
	if got["sheddable"]+got["default"]+got["critical"] != 10 || got["sheddable"] > 5 || got["sheddable"]+got["default"] > 8 {
		t.Fatalf("admitted per tier %v: want 10 in all, sheddable at most 5, sheddable and default at most 8", got)
	}
	g := newFixture(t, tierRules, Options{})
	f = g
	got = map[string]int{}
	for _, tier := range []string{"sheddable", "default", "critical"} {
		for range 20 {
			if ask(tier) {
				got[tier]++
			}
		}
	}
	if got["sheddable"] != 5 || got["default"] != 3 || got["critical"] != 2 {
		t.Fatalf("one tier after another: %v, want sheddable 5, default 3, critical 2", got)
	}
	st := g.e.Stats()[0].Tiers
	if len(st) != 3 || st[0].Tier != "critical" || st[0].Allowed != 2 || st[0].Limited != 18 || st[2].Allowed != 5 || st[2].Limited != 15 {
		t.Fatalf("tier counts %+v", st)
	}
	// A request naming no tier, or one that is not a level, is of the
	// default tier.
	var res Result
	g.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	if res.Allowed || res.Statuses[0].Tier != 1 {
		t.Fatalf("no tier named: %+v", res.Statuses[0])
	}
}

// A request's tier is known whenever the file has a priority section, for
// the concurrency limit in front of the service.
func TestTierIsKnownWithoutTieredRules(t *testing.T) {
	f := newFixture(t, "priority: {from: header:X-Priority}\nrules:\n  - {id: a, key: [ip], rate: 10, per: 1s}\n", Options{})
	for tier, want := range map[string]int{"critical": 0, "sheddable": 2, "": 1} {
		req := userReq("u")
		req.Header = http.Header{"X-Priority": {tier}}
		var res Result
		f.e.Check(context.Background(), req, CheckOptions{}, &res)
		if res.Tier() != want {
			t.Errorf("X-Priority %q: tier %d, want %d", tier, res.Tier(), want)
		}
	}
}

// A route tier is the tier of the path the upstream will serve: a path that
// servers read in different ways is refused before it can claim one, and
// with encodedSlashes: decode the tier is that of the decoded path.
func TestRouteTiersCannotBeClaimedByPathTricks(t *testing.T) {
	const src = `
priority:
  routes: {"/checkout/*": critical}
rules:
  - {id: a, key: [ip], rate: 10, per: 1s}
`
	tier := func(f *fixture, path string) (int, bool) {
		req := userReq("u")
		req.Path = path
		var res Result
		if err := f.e.Check(context.Background(), req, CheckOptions{}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Tier(), res.Invalid != ""
	}
	strict := newFixture(t, src, Options{})
	if lvl, _ := tier(strict, "/checkout/pay"); lvl != 0 {
		t.Fatalf("/checkout/pay: tier %d, want 0 (critical)", lvl)
	}
	for _, p := range []string{"/checkout/..%2Fapi/otp", "/checkout/..%5Capi/otp", "/checkout;x/../api/otp"} {
		if lvl, invalid := tier(strict, p); !invalid && lvl == 0 {
			t.Errorf("%s: tier %d and not refused, want it refused or of the tier of /api/otp", p, lvl)
		}
	}
	decode := newFixture(t, "paths: {encodedSlashes: decode}\n"+src, Options{})
	for _, p := range []string{"/checkout/..%2Fapi/otp", "/checkout/..%5Capi/otp", "/checkout\\..\\api/otp"} {
		if lvl, invalid := tier(decode, p); invalid || lvl != 1 {
			t.Errorf("decoding, %s: tier %d (refused %v), want 1, the tier of /api/otp", p, lvl, invalid)
		}
	}
}

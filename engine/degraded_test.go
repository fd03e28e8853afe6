package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/storecall"
)

// While the store fails, a fail-open rule admits this gateway's part of
// what the store last said was left of the key, left / N, on every API: a
// fresh key's part is limit / N, and one that admitted 10 of 100 through
// the store has floor(90 / 4) = 22.
func TestDegradedFailOpenAdmitsTheGatewayShare(t *testing.T) {
	src := "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n" +
		"  - {id: d, key: [tenant], rate: 100, per: 1h, envoy: {domain: edge, descriptors: [{key: tenant}]}}\n"
	f := newFixture(t, src, Options{Gateways: func() int { return 4 }})
	count := func(user string, n int) (admitted int) {
		for range n {
			if res := f.check(t, userReq(user)); res.Allowed {
				admitted++
			}
		}
		return admitted
	}
	envoy := func(tenant string, n int) (admitted int) {
		var res Result
		for range n {
			d := []Descriptor{{Entries: []rules.EnvoyEntry{{Key: "tenant", Value: tenant}}, Hits: 1}}
			if err := f.e.CheckDescriptors(context.Background(), "edge", d, &res); err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted++
			}
		}
		return admitted
	}
	// 10 admitted through the store, then the store fails: 90 / 4 more.
	if got := count("u", 10); got != 10 {
		t.Fatalf("healthy: %d", got)
	}
	if got := envoy("mirrored", 10); got != 10 {
		t.Fatalf("Envoy, healthy: %d", got)
	}
	f.store.mode.Store(1)
	// Envoy's answers from the store set the share too.
	if got := envoy("mirrored", 100); got != 22 {
		t.Fatalf("Envoy, degraded: %d admitted after the store said 90 were left, want 22 (90 / 4)", got)
	}
	var eres Result
	d := []Descriptor{{Entries: []rules.EnvoyEntry{{Key: "tenant", Value: "seen"}}, Hits: 1}}
	if err := f.e.CheckDescriptors(context.Background(), "edge", d, &eres); err != nil || eres.StoreError == nil || !eres.Statuses[0].FailedOpen {
		t.Fatalf("Envoy, degraded: store error %v, failed open %v; want the store's error reported", eres.StoreError, eres.Statuses[0].FailedOpen)
	}
	if got := count("u", 100); got != 22 {
		t.Fatalf("degraded: %d admitted after the store said 90 were left, want 22 (90 / 4)", got)
	}
	if res := f.check(t, userReq("new")); !res.Allowed || res.Decision.Remaining != 24 || !res.Statuses[0].FailedOpen {
		t.Fatalf("degraded, a new key's first check: %+v, want allowed with 24 of the share of 25 left", res.Decision)
	}
	if got := count("fresh", 100); got != 25 {
		t.Fatalf("degraded, fresh key: %d, want the share 25", got)
	}
	var res Result
	f.e.Check(context.Background(), userReq("fresh"), CheckOptions{}, &res)
	if !res.Degraded() {
		t.Fatal("a degraded answer does not say so")
	}
	// Envoy's gRPC path follows the same share.
	admitted := 0
	for range 100 {
		d := []Descriptor{{Entries: []rules.EnvoyEntry{{Key: "tenant", Value: "t"}}, Hits: 1}}
		if err := f.e.CheckDescriptors(context.Background(), "edge", d, &res); err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 25 {
		t.Fatalf("Envoy, degraded: %d admitted, want the share 25", admitted)
	}
}

func TestShareDividesRateAndBurst(t *testing.T) {
	for _, tc := range []struct {
		l    sluice.Limit
		n    int
		want sluice.Limit
	}{
		{sluice.Limit{Rate: 100, Period: time.Minute, Burst: 20}, 3, sluice.Limit{Rate: 33, Period: time.Minute, Burst: 6}},
		{sluice.Limit{Rate: 2, Period: time.Minute}, 5, sluice.Limit{Rate: 1, Period: time.Minute}},
		{sluice.Limit{Rate: 10, Period: time.Minute, Algorithm: sluice.FixedWindow}, 2, sluice.Limit{Rate: 5, Period: time.Minute, Algorithm: sluice.FixedWindow}},
		{sluice.Limit{Rate: 10, Period: time.Minute}, 1, sluice.Limit{Rate: 10, Period: time.Minute}},
	} {
		if got := tc.l.Share(tc.n); got != tc.want {
			t.Errorf("%v.Share(%d) = %+v, want %+v", tc.l, tc.n, got, tc.want)
		}
	}
}

// The share follows the number of gateways without forgetting what this
// gateway admitted: alone it admitted 99 of 100 through the store; a second
// gateway joins and the store fails; its share is now 50, and it has used
// 99 of it: it admits nothing more. A limit below the number of gateways
// gives each no unit while the store fails (rounding each share up would
// admit N units for a limit of 1).
func TestTheShareFollowsTheGatewayCountAndKeepsWhatWasAdmitted(t *testing.T) {
	var gateways atomic.Int64
	gateways.Store(1)
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Gateways: func() int { return int(gateways.Load()) }})
	admit := func(req *rules.Request, n int) (admitted int) {
		for range n {
			if f.check(t, req).Allowed {
				admitted++
			}
		}
		return admitted
	}
	if got := admit(userReq("u"), 99); got != 99 {
		t.Fatalf("healthy: %d", got)
	}
	gateways.Store(2)
	f.store.mode.Store(1)
	if got := admit(userReq("u"), 60); got != 0 {
		t.Fatalf("degraded after 99 through the store, now one of 2 gateways: %d admitted, want 0 (its share is 50)", got)
	}
	if got := admit(userReq("fresh"), 60); got != 50 {
		t.Fatalf("degraded, a fresh key, one of 2 gateways: %d admitted, want its share of 50", got)
	}
	one := newFixture(t, "rules:\n  - {id: one, key: [user], rate: 1, per: 1h}\n", Options{Gateways: func() int { return 2 }})
	one.store.mode.Store(1)
	for range 5 {
		if one.check(t, userReq("u")).Allowed {
			t.Fatal("a limit of 1 over 2 gateways admitted a request while the store failed")
		}
	}
}

// The parts of N gateways add up to what the store had left, whatever the
// load balancer sent each one: gateway a admitted 81 of 100 through the
// store, b 16, their last looks said 4 and 3 were left; when the store
// fails, a's part is floor(4 / 2) = 2 and b's 1: 100 in all. Counted as a
// share of the limit less each gateway's own admissions, b would have
// admitted 34 more (131 in all). A look older than the others' admissions adds what they
// took since, over N: b's last look said 10 were left, a took 5 since, and
// b's part is 5 (102 in all, over by 5/2 rounded up).
func TestTheGatewaysPartsAddUpToWhatTheStoreHadLeft(t *testing.T) {
	const src = "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n"
	a := newFixture(t, src, Options{Gateways: func() int { return 2 }, Calls: storecall.Options{BreakerFailures: 1 << 20}})
	b := newFixture(t, src, Options{Gateways: func() int { return 2 }, Calls: storecall.Options{BreakerFailures: 1 << 20}})
	b.store.inner = a.mem // one store, two gateways each with its own fallback
	admit := func(f *fixture, user string, n int) (admitted int) {
		for range n {
			if f.check(t, userReq(user)).Allowed {
				admitted++
			}
		}
		return admitted
	}
	fail := func() { a.store.mode.Store(1); b.store.mode.Store(1) }
	heal := func() { a.store.mode.Store(0); b.store.mode.Store(0) }

	if admit(a, "u", 80)+admit(b, "u", 15)+admit(a, "u", 0) != 95 {
		t.Fatal("healthy: not 95")
	}
	admit(a, "u", 1) // a looks again: 4 left after its take
	admit(b, "u", 1) // and b: 3 left
	fail()
	if got := admit(a, "u", 50) + admit(b, "u", 50); got != 3 {
		t.Fatalf("degraded: %d admitted after the store said 4 and 3 were left, want 3 (2 + 1: each gateway's part over 2)", got)
	}

	heal()
	if admit(b, "v", 90) != 90 {
		t.Fatal("healthy: v not 90")
	}
	if admit(a, "v", 5) != 5 { // b's last look (10 left) is now 5 stale
		t.Fatal("healthy: v not 5 more")
	}
	fail()
	got := admit(a, "v", 50) + admit(b, "v", 50)
	if got != 2+5 {
		t.Fatalf("degraded: %d admitted, want 7: a's part of the 5 it saw left (2), b's of the 10 it saw (5)", got)
	}
	if over := 95 + got - 100; over > (5+1)/2 {
		t.Fatalf("over by %d, more than b's stale look allows (5 taken since, over 2 gateways)", over)
	}
}

// deadlineStore records how long its call's context had left, after
// sleeping for its own latency.
// partitionedStore is a store of two nodes, "a" (keys starting with a)
// and "b", whose node b fails. It names a key's node by a view of the key,
// which the engine reuses for the next request: the guard must keep its own
// copy. (The embedded store is a field: its NonBlocking mark would take the
// guard off.)
type partitionedStore struct{ inner sluice.Store }

func (partitionedStore) Partition(tk *sluice.Take) string { return tk.Key[:1] }

func (p partitionedStore) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if takes[0].Key[:1] == "b" {
		return errDown
	}
	return p.inner.Take(ctx, takes, out)
}

// A store of independent nodes has a breaker per node: node b failing
// opens b's, and keys on node a are still decided by the store; the
// breakers are named by their own copy of the node's name.
func TestAFailingNodeOpensItsOwnBreaker(t *testing.T) {
	cfg := mustRules(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n")
	e, err := New(cfg, Options{Store: partitionedStore{memory.New()}, Logger: quiet, Calls: storecall.Options{BreakerFailures: 1, BreakerOpenFor: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	for range 3 {
		e.Check(context.Background(), userReq("b1"), CheckOptions{}, &res)
	}
	e.Check(context.Background(), userReq("a1"), CheckOptions{}, &res)
	if st := e.Store().BreakerStates(); st["b"] != "open" || st["a"] != "closed" {
		t.Fatalf("breakers %v, want b open and a closed", st)
	}
	if !res.Allowed || res.StoreError != nil || res.Statuses[0].FailedOpen {
		t.Fatalf("a key on the healthy node: %+v, store error %v", res.Decision, res.StoreError)
	}
}

// A countOn rule's charge after the response, when the store does not
// answer, is counted in the gateway's share, as the request's check was,
// and written back once the store answers: failed logins are counted
// through an outage, not forgotten.
func TestACountOnChargeIsCountedWhileTheStoreFails(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 3, per: 1h, countOn: {status: [401]}}\n", Options{Calls: storecall.Options{BreakerFailures: 1 << 20}})
	req := func() *rules.Request { r := userReq("u"); r.Path = "/login"; return r }
	f.store.mode.Store(1)
	for i := range 3 {
		res := f.check(t, req())
		if !res.Allowed {
			t.Fatalf("failed login %d, store down: refused %+v", i+1, res.Decision)
		}
		f.e.Charge(context.Background(), res, 401)
	}
	if res := f.check(t, req()); res.Allowed {
		t.Fatal("a fourth login after three failures while the store was down was admitted: the failures were not counted")
	}
	if o := f.e.Store().Owed(); o.Owed != 3 {
		t.Fatalf("owed %d units, want the 3 failures", o.Owed)
	}
	f.store.mode.Store(0)
	for deadline := time.Now().Add(10 * time.Second); f.e.Store().Owed().Owed > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still owed after 10 s: %+v", f.e.Store().Owed())
		}
		r := req()
		r.Header.Set("X-User-Id", "traffic") // a store call that kicks the write-back
		f.check(t, r)
	}
	if d, _, _ := f.e.Inspect(context.Background(), "login", "u"); d.Remaining != 0 {
		t.Fatalf("the store has %d left once it answered, want 0: the failures written back", d.Remaining)
	}
}

// A charge the store took is mirrored into the gateway's share, as an
// admission is: two failures counted by the store leave one for the share
// of 3 when the store then fails.
func TestACountOnChargeIsMirroredIntoTheShare(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 3, per: 1h, countOn: {status: [401]}}\n", Options{Calls: storecall.Options{BreakerFailures: 1 << 20}})
	req := func() *rules.Request { r := userReq("u"); r.Path = "/login"; return r }
	for range 2 {
		f.e.Charge(context.Background(), f.check(t, req()), 401)
	}
	f.store.mode.Store(1)
	res := f.check(t, req())
	if !res.Allowed {
		t.Fatalf("the third attempt, store down: refused %+v", res.Decision)
	}
	f.e.Charge(context.Background(), res, 401)
	if res := f.check(t, req()); res.Allowed {
		t.Fatal("a fourth attempt after three failures (two counted by the store) was admitted while the store was down")
	}
}

// The service's /v1/charge (ChargeStatus) counts a charge the store does
// not take as Charge does: in the share, owed, and said degraded.
func TestAChargeStatusIsCountedWhileTheStoreFails(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 3, per: 1h, countOn: {status: [401]}}\n", Options{Calls: storecall.Options{BreakerFailures: 1 << 20}})
	req := func() *rules.Request { r := userReq("u"); r.Path = "/login"; return r }
	f.store.mode.Store(1)
	var res Result
	for range 3 {
		if err := f.e.ChargeStatus(context.Background(), req(), CheckOptions{}, 401, &res); err != nil || len(res.Statuses) != 1 || !res.Statuses[0].FailedOpen || res.StoreError == nil {
			t.Fatalf("a charge while the store is down: %v, %+v", err, res.Statuses)
		}
	}
	if got := f.check(t, req()); got.Allowed {
		t.Fatal("a fourth login after three failures charged while the store was down was admitted")
	}
	if o := f.e.Store().Owed(); o.Owed != 3 {
		t.Fatalf("owed %d, want the 3 failures", o.Owed)
	}
}

// An Envoy usage report the store does not take is spent all the same:
// counted in the gateway's share, owed to the store and written back, as a
// countOn charge is. Without that a token quota is unlimited for an outage.
func TestAUsageReportIsCountedWhileTheStoreFails(t *testing.T) {
	const src = "domain: rl\ndescriptors:\n  - key: service\n    value: s\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
	f := newFixture(t, src, Options{Calls: storecall.Options{BreakerFailures: 1 << 20}})
	call := func(d Descriptor) *Result {
		var res Result
		if err := f.e.CheckDescriptors(context.Background(), "rl", []Descriptor{d}, &res); err != nil {
			t.Fatal(err)
		}
		return &res
	}
	f.store.mode.Store(1)
	for i := range 3 {
		if res := call(hits(1, "service", "s")); !res.Statuses[0].FailedOpen {
			t.Fatalf("usage report %d, store down: %+v, want answered failing open", i+1, res.Statuses[0])
		}
	}
	if res := call(desc("service", "s")); res.Allowed {
		t.Fatal("a request after 3 of 3 reported while the store was down was admitted: the reports were not counted")
	}
	if o := f.e.Store().Owed(); o.Owed != 3 {
		t.Fatalf("owed %d units, want the 3 reported", o.Owed)
	}
}

// A rule with its own fallback limit counts what this gateway admitted
// through the store in that limit too: 2 healthy admissions of a per-node
// fallback of 3 leave 1 when the store fails.
func TestAFallbackLimitCountsWhatWasAdmittedThroughTheStore(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h, fallback: {rate: 3, per: 1h}}\n", Options{Calls: storecall.Options{BreakerFailures: 1000}})
	for range 2 {
		if !f.check(t, userReq("u")).Allowed {
			t.Fatal("healthy: refused")
		}
	}
	f.store.mode.Store(1)
	admitted := 0
	for range 5 {
		if f.check(t, userReq("u")).Allowed {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("store failing after 2 admitted through it, fallback 3: %d admitted, want 1", admitted)
	}
}

// A rule with tiers keeps its floor in the share too: the store's last
// answer for a low tier (what is left above the floor) plus the floor is
// what the gateway's share starts from, so the critical tier keeps its
// part while the store fails.
func TestTheShareOfATieredRuleKeepsTheFloor(t *testing.T) {
	f := newFixture(t, `
priority: {from: header:X-Priority}
rules:
  - {id: r, key: [user], rate: 10, per: 1h, tiers: {critical: 40%}}
`, Options{Calls: storecall.Options{BreakerFailures: 1000}})
	normal := func() *rules.Request { r := userReq("u"); r.Header["X-Priority"] = []string{"sheddable"}; return r }
	critical := func() *rules.Request { r := userReq("u"); r.Header["X-Priority"] = []string{"critical"}; return r }
	n := 0
	for range 10 {
		if f.check(t, normal()).Allowed {
			n++
		}
	}
	if n != 6 {
		t.Fatalf("healthy, normal tier: %d admitted of 10, want 6 (4 kept for critical)", n)
	}
	f.store.mode.Store(1)
	if f.check(t, normal()).Allowed {
		t.Fatal("store failing: the normal tier was admitted past its part")
	}
	c := 0
	for range 10 {
		if f.check(t, critical()).Allowed {
			c++
		}
	}
	if c != 4 {
		t.Fatalf("store failing: the critical tier admitted %d, want the 4 kept for it", c)
	}
}

// A rule without countOn that fails open is charged at the check, as when
// the store answers: nothing is left to charge after the response.
func TestAFailedOpenRuleWithoutCountOnHasNothingToChargeLater(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Calls: storecall.Options{BreakerFailures: 1000}})
	f.store.mode.Store(1)
	res := f.check(t, userReq("u"))
	if !res.Allowed || !res.Statuses[0].FailedOpen || res.Statuses[0].charge != 0 {
		t.Fatalf("failed open: allowed %v, %+v, charge %d, want 0", res.Allowed, res.Statuses[0], res.Statuses[0].charge)
	}
}

func TestADegradedFloorIsTheSameShareOfTheDegradedLimit(t *testing.T) {
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	for _, c := range []struct {
		floor int64
		dl    sluice.Limit
		want  int64
	}{
		{4, l, 4},
		{0, sluice.Limit{Rate: 5, Period: time.Hour}, 0},
		{4, sluice.Limit{Rate: 5, Period: time.Hour}, 2},
		{3, sluice.Limit{Rate: 5, Period: time.Hour}, 2}, // 1.5, rounded up
		{10, sluice.Limit{Rate: 3, Period: time.Hour}, 3},
	} {
		if got := degradedFloor(c.floor, c.dl, l); got != c.want {
			t.Errorf("floor %d of %v in %v: %d, want %d", c.floor, l, c.dl, got, c.want)
		}
	}
}

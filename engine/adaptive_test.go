package engine

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

type factor struct{ bits atomic.Uint64 }

func (f *factor) set(v float64)   { f.bits.Store(math.Float64bits(v)) }
func (f *factor) get() float64    { return math.Float64frombits(f.bits.Load()) }
func newFactor(v float64) *factor { f := &factor{}; f.set(v); return f }

const adaptiveRules = `
priority: {from: header:X-Priority}
rules:
  - {id: api, key: [user], rate: 100, per: 1h, adaptive: true}
  - {id: tiered, key: [tenant], rate: 100, per: 1h, adaptive: true, tiers: {critical: 50%}, onMissingKey: skip}
  - {id: fixed, key: [user], rate: 1000, per: 1h}
`

func admitted(t *testing.T, f *fixture, n int, req func() *Result) (int, *Result) {
	t.Helper()
	ok := 0
	var last *Result
	for range n {
		last = req()
		if last.Allowed {
			ok++
		}
	}
	return ok, last
}

// An adaptive rule admits its rate times the pressure factor: 100 at 1,
// 50 at 0.5, with its count kept across changes of the factor; a refusal
// under the reduced limit is marked Reduced, with the reduced limit in the
// decision. The rule that is not adaptive keeps
// its rate.
func TestAdaptiveRulesShrinkWithThePressure(t *testing.T) {
	p := newFactor(0.5)
	f := newFixture(t, adaptiveRules, Options{Pressure: p.get})
	check := func(user string) func() *Result {
		return func() *Result { return f.check(t, userReq(user)) }
	}
	n, last := admitted(t, f, 200, check("u1"))
	if n != 50 {
		t.Fatalf("at factor 0.5: %d admitted of 100 per hour, want 50", n)
	}
	if !last.Reduced || last.Decision.Limit.Rate != 50 || last.Decision.Rule != "api" {
		t.Fatalf("the refusal: reduced %v, decision %+v", last.Reduced, last.Decision)
	}
	// The service recovers. The 50 at half rate took the whole bucket; it
	// refills at the full rate again: 30 in 18 minutes.
	p.set(1)
	f.clock.Advance(18 * time.Minute)
	if n, _ := admitted(t, f, 200, check("u1")); n != 30 {
		t.Fatalf("back at factor 1, 18 minutes on: %d more admitted, want 30", n)
	}
	res := check("u1")()
	if res.Reduced || res.Decision.Limit.Rate != 100 {
		t.Fatalf("at full rate the refusal is the client's: reduced %v, limit %v", res.Reduced, res.Decision.Limit)
	}
	p.set(0.25)
	g := newFixture(t, adaptiveRules, Options{Pressure: p.get})
	if n, _ := admitted(t, g, 200, func() *Result { return g.check(t, userReq("u2")) }); n != 25 {
		t.Fatalf("at factor 0.25: %d admitted, want 25", n)
	}
	if d, _, _ := g.e.Inspect(context.Background(), "api", "u2"); d.Remaining != 0 {
		t.Fatalf("inspect: %+v", d)
	}
	// Refill follows the reduced rate: 0.25 x 100 per hour, one per 144 s.
	g.clock.Advance(144 * time.Second)
	if n, _ := admitted(t, g, 5, func() *Result { return g.check(t, userReq("u2")) }); n != 1 {
		t.Fatalf("144 s later at factor 0.25: %d admitted, want 1", n)
	}
}

// Under pressure with tiers, the shrinking falls on the lowest tier first:
// critical keeps its half of the full rate, in requests, as long as the
// reduced rate holds it; the tier below gets what is left.
func TestAdaptiveTiersShedTheLowestFirst(t *testing.T) {
	for _, c := range []struct {
		factor        float64
		low, critical int
	}{{1, 50, 50}, {0.75, 24, 50}, {0.5, 0, 50}, {0.25, 0, 25}} {
		p := newFactor(c.factor)
		f := newFixture(t, adaptiveRules, Options{Pressure: p.get})
		ask := func(tier string) func() *Result {
			return func() *Result {
				req := userReq("")
				req.Header.Del("X-User-Id")
				req.Header.Set("X-Tenant-Id", "t1")
				req.Header.Set("X-Priority", tier)
				return f.check(t, req)
			}
		}
		low, _ := admitted(t, f, 200, ask("default"))
		crit, _ := admitted(t, f, 200, ask("critical"))
		if low != c.low || crit != c.critical {
			t.Errorf("factor %v: default %d, critical %d; want %d, %d", c.factor, low, crit, c.low, c.critical)
		}
	}
}

// A cost that fits the rule's burst but not the reduced one is refused as
// the pressure's (503, retry in a second), not as a cost that can never
// pass.
func TestACostTooLargeOnlyUnderPressureIsRetryable(t *testing.T) {
	p := newFactor(0.5)
	f := newFixture(t, adaptiveRules, Options{Pressure: p.get})
	var res Result
	if err := f.e.Check(context.Background(), userReq("u9"), CheckOptions{Cost: 80}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Reason != sluice.ReasonLimited || !res.Reduced || res.Decision.RetryAfter != time.Second {
		t.Fatalf("cost 80 of a burst of 100 at half rate: %+v (reduced %v)", res.Decision, res.Reduced)
	}
	if err := f.e.Check(context.Background(), userReq("u8"), CheckOptions{Cost: 100}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Reason != sluice.ReasonLimited || !res.Reduced || res.Decision.RetryAfter != time.Second {
		t.Fatalf("cost 100, the whole burst, at half rate: %+v (reduced %v), want the pressure's refusal", res.Decision, res.Reduced)
	}
	if err := f.e.Check(context.Background(), userReq("u9"), CheckOptions{Cost: 101}, &res); err != nil {
		t.Fatal(err)
	}
	if res.Reason != sluice.ReasonTooLarge || res.Reduced {
		t.Fatalf("cost 101 of a burst of 100: %+v, want too large", res.Decision)
	}
}

// A pressure source answering 0 or above 1 is taken as no pressure; a
// reduced limit reduces a burst too.
func TestOddFactorsAndReducedBursts(t *testing.T) {
	for _, v := range []float64{0, 1.5, math.NaN()} {
		p := newFactor(v)
		f := newFixture(t, adaptiveRules, Options{Pressure: p.get})
		if n, _ := admitted(t, f, 200, func() *Result { return f.check(t, userReq("u")) }); n != 100 {
			t.Errorf("factor %v: %d admitted, want the full 100", v, n)
		}
	}
	p := newFactor(0.5)
	f := newFixture(t, "rules:\n  - {id: b, key: [user], rate: 100, per: 1h, burst: 40, adaptive: true}\n", Options{Pressure: p.get})
	res := f.check(t, userReq("u"))
	if l := res.Decision.Limit; l.Rate != 50 || l.Burst != 20 {
		t.Fatalf("at half rate the limit is %v, want 50 per hour, burst 20", l)
	}
}

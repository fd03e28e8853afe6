package httplimit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// Results whose RefusalKeys are equal render the same fields and the same
// problem: random refused results over small domains (so that keys meet
// often), with the fields the key leaves out (other statuses' remaining
// units, sub-second waits, resets without the legacy fields, tiers) drawn
// at random too.
func TestRefusalKeyDecidesTheRendering(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	limits := []sluice.Limit{{Rate: 5, Period: time.Minute}, {Rate: 100, Period: time.Hour, Burst: 10}, {Rate: 1, Period: time.Second, Algorithm: sluice.FixedWindow}}
	reasons := []sluice.Reason{sluice.ReasonLimited, sluice.ReasonLocked, sluice.ReasonUnavailable, sluice.ReasonMissingKey, sluice.ReasonTooLarge}
	waits := []time.Duration{0, 300 * time.Millisecond, time.Second, 1700 * time.Millisecond, 90 * time.Second, 2*time.Hour + time.Second}
	pick := func(n int) int { return rng.IntN(n) }
	random := func() *engine.Result {
		res := &engine.Result{Reduced: pick(4) == 0}
		for range 1 + pick(maxKeyStatuses+1) {
			res.Statuses = append(res.Statuses, engine.Status{
				Decision: sluice.Decision{Rule: []string{"a", "b", "c"}[pick(3)], Limit: limits[pick(len(limits))], Allowed: pick(2) == 0,
					Remaining: int64(pick(3)), RetryAfter: waits[pick(len(waits))], ResetAfter: waits[pick(len(waits))]},
				Shadow: pick(4) == 0, Tier: pick(3),
			})
		}
		d := res.Statuses[pick(len(res.Statuses))].Decision
		d.Allowed, d.Reason = false, reasons[pick(len(reasons))]
		d.RetryAfter, d.ResetAfter = waits[pick(len(waits))]+time.Duration(pick(900))*time.Millisecond/1000, waits[pick(len(waits))]
		res.Decision = d
		return res
	}
	render := func(l *Limiter, res *engine.Result) string {
		out := ""
		l.VisitHeaders(res, func(name string, v []byte) { out += name + ": " + string(v) + "\n" })
		var p Problem
		FillProblem(&p, res)
		body, _ := json.Marshal(p)
		return out + string(body)
	}
	for _, legacy := range []bool{false, true} {
		l := New(nil, Options{LegacyHeaders: legacy})
		seen := map[RefusalKey]string{}
		repeats, keyless := 0, 0
		for range 60000 {
			res := random()
			var k RefusalKey
			if !l.RefusalKey(res, &k) {
				keyless++
				continue
			}
			got := render(l, res)
			if want, ok := seen[k]; ok {
				repeats++
				if got != want {
					t.Fatalf("legacy %v: equal keys, different refusals:\n%s\n---\n%s\nresult %+v", legacy, got, want, res)
				}
			}
			seen[k] = got
		}
		if repeats < 1000 || keyless == 0 {
			t.Fatalf("legacy %v: %d results met an earlier key, %d had none: the test compares too little", legacy, repeats, keyless)
		}
		t.Log(fmt.Sprintf("legacy %v: %d distinct keys, %d repeats, %d without a key", legacy, len(seen), repeats, keyless))

		// A kept Refusal, fed results that often repeat the last one's key
		// (a few results drawn again and again) and often do not, always
		// holds the rendering of the result it was last given.
		pool := make([]*engine.Result, 6)
		for i := range pool {
			pool[i] = random()
		}
		var r Refusal
		for range 20000 {
			res := pool[pick(len(pool))]
			if pick(8) == 0 {
				res = random()
			}
			r.Render(l, res)
			got := ""
			for i := range r.Fields() {
				name, v := r.Field(i)
				got += name + ": " + string(v) + "\n"
			}
			var p Problem
			if err := json.Unmarshal(r.Body(), &p); err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(p)
			if want := render(l, res); got+string(body) != want || r.Status() != p.Status {
				t.Fatalf("legacy %v: a kept refusal differs from its result's rendering:\n%s%s (status %d)\n---\n%s", legacy, got, body, r.Status(), want)
			}
		}
	}
}

// A rule's cost is part of a refusal's key: the same rule, limit and wait
// with another cost (a reload changed it) advertises another quota in
// requests, and a kept refusal must not show the other cost's fields.
func TestRefusalKeyHoldsTheCost(t *testing.T) {
	clock := sluice.NewManualClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	refusal := func(cost int) (RefusalKey, string) {
		cfg, err := rules.Parse("r.yaml", []byte(fmt.Sprintf("rules:\n  - {id: a, key: [ip], rate: 10, per: 1h, algorithm: fixed-window, cost: %d}\n", cost)))
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock))})
		if err != nil {
			t.Fatal(err)
		}
		l := New(e, Options{})
		req := rules.Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("192.0.2.1")}
		var res engine.Result
		for range 11 {
			e.Check(context.Background(), &req, engine.CheckOptions{}, &res)
			if !res.Allowed {
				break
			}
		}
		if res.Allowed {
			t.Fatalf("cost %d: never refused", cost)
		}
		var k RefusalKey
		if !l.RefusalKey(&res, &k) {
			t.Fatal("no key")
		}
		out := ""
		l.VisitHeaders(&res, func(name string, v []byte) { out += name + ": " + string(v) + "\n" })
		return k, out
	}
	k1, r1 := refusal(1)
	k5, r5 := refusal(5)
	if r1 == r5 {
		t.Fatalf("the two costs render alike, the test shows nothing:\n%s", r1)
	}
	if k1 == k5 {
		t.Fatalf("equal keys for different refusals:\n%s---\n%s", r1, r5)
	}
}

// A refusal with no wait (a cost that can never pass) carries no
// Retry-After: waiting would not help.
func TestARefusalWithNoWaitHasNoRetryAfter(t *testing.T) {
	l := New(nil, Options{})
	res := &engine.Result{Decision: sluice.Decision{Reason: sluice.ReasonTooLarge, Rule: "r", Limit: sluice.Limit{Rate: 5, Period: time.Minute}}}
	res.Statuses = []engine.Status{{Decision: res.Decision}}
	got := map[string]string{}
	l.visitRejectFields(func(name string, v []byte) { got[name] = string(v) }, res, nil)
	if v, ok := got["Retry-After"]; ok {
		t.Fatalf("Retry-After %q on a refusal with no wait", v)
	}
	res.Decision.RetryAfter = 1500 * time.Millisecond
	got = map[string]string{}
	l.visitRejectFields(func(name string, v []byte) { got[name] = string(v) }, res, nil)
	if got["Retry-After"] != "2" {
		t.Fatalf("Retry-After %q for 1.5 s, want 2 (rounded up)", got["Retry-After"])
	}
}

// A refusal is keyed for reuse with up to maxKeyStatuses statuses, not more.
func TestARefusalKeyHoldsUpToMaxKeyStatuses(t *testing.T) {
	l := New(nil, Options{})
	for _, n := range []int{maxKeyStatuses, maxKeyStatuses + 1} {
		res := &engine.Result{Decision: sluice.Decision{Reason: sluice.ReasonLimited, Rule: "r", RetryAfter: time.Second}}
		for range n {
			res.Statuses = append(res.Statuses, engine.Status{Decision: res.Decision})
		}
		var k RefusalKey
		if ok := l.RefusalKey(res, &k); ok != (n <= maxKeyStatuses) {
			t.Fatalf("%d statuses: keyed %v", n, ok)
		}
	}
}

package engine

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// A key of exactly MaxKeyBytes is kept as sent; one byte more is hashed.
func TestKeyBoundIsInclusive(t *testing.T) {
	k64 := strings.Repeat("a", MaxKeyBytes)
	if StoreKey(k64) != k64 {
		t.Fatal("a 64-byte key was hashed")
	}
	if k := StoreKey(k64 + "a"); !strings.HasPrefix(k, hashedKeyPrefix) {
		t.Fatal("a 65-byte key was kept")
	}
}

// mulCost saturates only when the product does not fit.
func TestMulCost(t *testing.T) {
	for _, tc := range []struct{ a, b, want int64 }{
		{3, 4, 12}, {0, 5, 0}, {5, 0, 0}, {math.MaxInt64 / 3, 3, math.MaxInt64 / 3 * 3},
		{math.MaxInt64/3 + 1, 3, math.MaxInt64}, {1 << 62, 3, math.MaxInt64}, {math.MaxInt64, 1, math.MaxInt64},
	} {
		if got := mulCost(tc.a, tc.b); got != tc.want {
			t.Errorf("mulCost(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// An override is idle one second after its period has passed unused, not
// before.
func TestOverrideIdleAfterItsPeriodAndASecond(t *testing.T) {
	o := newDescriptorLimits(1, nil)
	o.start = o.start.Add(-time.Hour) // an engine running for an hour
	l := userLimit(time.Minute)
	if !o.admit("r", l) {
		t.Fatal("first override refused")
	}
	o.start = o.start.Add(-(time.Minute + 500*time.Millisecond)) // 60.5 s later
	if o.admit("r", userLimit(time.Hour)) {
		t.Fatal("an override idle for its period + 0.5 s was dropped")
	}
	o.start = o.start.Add(-time.Second) // 61.5 s later
	if !o.admit("r", userLimit(time.Hour)) {
		t.Fatal("an override idle for its period + 1.5 s was kept")
	}
}

// A reload keeps the counters of rules whose id and limit did not change,
// and only theirs.
func TestReloadKeepsOnlyUnchangedRulesCounters(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: a, key: [user], rate: 5, per: 1h}\n  - {id: b, key: [user], rate: 5, per: 1h}\n", Options{})
	for range 3 {
		f.check(t, userReq("u"))
	}
	f.e.Reload(mustRules(t, "rules:\n  - {id: a, key: [user], rate: 5, per: 1h}\n  - {id: c, key: [user], rate: 5, per: 1h}\n  - {id: b, key: [user], rate: 6, per: 1h}\n"))
	got := map[string]uint64{}
	for _, s := range f.e.Stats() {
		got[s.Rule] = s.Allowed
	}
	if got["a"] != 3 || got["b"] != 0 || got["c"] != 0 {
		t.Fatalf("counters after reload: %v, want a 3, b (changed limit) 0, c (new) 0", got)
	}
}

func userLimit(period time.Duration) sluice.Limit {
	return sluice.Limit{Rate: 10, Period: period, Algorithm: sluice.FixedWindow}
}

// The combined answer: the longest delay of the leaky-queue rules; when
// allowed, the rule with the least left; when refused, the refusal that
// can never pass, else the one that asks to wait longest.
func TestCombineChoosesTheDecidingRule(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: q, key: [user], rate: 10, per: 1s, burst: 5, algorithm: leaky-queue}
  - {id: small, key: [user], rate: 3, per: 1h}
  - {id: big, key: [user], rate: 100, per: 1h}
`, Options{})
	f.check(t, userReq("u"))
	res := f.check(t, userReq("u"))
	if res.Delay <= 0 {
		t.Fatalf("the leaky queue's delay was lost: %v", res.Delay)
	}
	if res.Decision.Rule != "small" {
		t.Fatalf("allowed: deciding rule %q, want small (least left)", res.Decision.Rule)
	}
	g := newFixture(t, `
rules:
  - {id: minute, key: [user], rate: 1, per: 1m}
  - {id: hour, key: [user], rate: 1, per: 1h}
`, Options{})
	g.check(t, userReq("u"))
	if res := g.check(t, userReq("u")); res.Allowed || res.Decision.Rule != "hour" {
		t.Fatalf("refused: deciding rule %q, want hour (the longer wait)", res.Decision.Rule)
	}
	var r Result
	g.e.Check(context.Background(), userReq("v"), CheckOptions{Cost: 2}, &r)
	if r.Allowed || r.Reason != sluice.ReasonTooLarge {
		t.Fatalf("a cost over every burst: %+v", r.Decision)
	}
}

// Near-limit counts allowed requests that left at most 10% of the burst.
func TestNearLimitCount(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 10, per: 1h}\n", Options{})
	for range 10 {
		f.check(t, userReq("u"))
	}
	for _, s := range f.e.Stats() {
		if s.Rule == "r" && s.NearLimit != 2 { // remaining 1 and 0
			t.Fatalf("near-limit %d, want 2", s.NearLimit)
		}
	}
}

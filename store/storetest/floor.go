package storetest

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// testFloorsMatchAlgo runs takes above random floors (priority tiers on one
// key) mixed with plain takes against algo's TakeAbove.
func testFloorsMatchAlgo(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(l.String(), func(t *testing.T) {
			clock, s, p := againstModel(t, newStore, l)
			model := algo.NewState(p)
			rng := rand.New(rand.NewPCG(uint64(l.Algorithm), 11))
			for i := range 400 {
				advance(clock, time.Duration(rng.Int64N(max(p.T, p.W/int64(max(p.Burst, 1))))))
				cost := 1 + rng.Int64N(2)
				floor := []int64{0, 1, p.Burst / 2, p.Burst - 1, p.Burst}[rng.IntN(5)]
				d := call1(t, s, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: cost, Floor: floor})
				var want algo.Result
				model.TakeAbove(clock.Now(), cost, floor, &want)
				if !sameDecision(d, want) {
					t.Fatalf("step %d take %d above %d: store %s, algo %+v", i, cost, floor, Describe(d), want)
				}
			}
		})
	}
}

// testFloorsKeepTheShareAbove: a lower tier never takes the share kept for
// the tiers above it, and the top tier can; in a multi-key call a floor's
// refusal consumes nothing elsewhere.
func testFloorsKeepTheShareAbove(t *testing.T, newStore Factory) {
	l := sluice.Limit{Rate: 10, Period: time.Hour, Burst: 10}
	s := newStore(t, sluice.NewManualClock(Epoch))
	low := 0
	for range 20 {
		if d := call1(t, s, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1, Floor: 4}); d.Allowed {
			low++
		}
	}
	if low != 6 {
		t.Fatalf("the low tier took %d of 10 above a floor of 4, want 6", low)
	}
	out := make([]sluice.Decision, 2)
	if err := s.Take(t.Context(), []sluice.Take{
		{Rule: "other", Key: "k", Limit: l, Cost: 1},
		{Rule: "r", Key: "k", Limit: l, Cost: 1, Floor: 4},
	}, out); err != nil {
		t.Fatal(err)
	}
	if out[1].Allowed || out[1].Remaining != 0 {
		t.Fatalf("the low tier at its floor: %s", Describe(out[1]))
	}
	if d := take1(t, s, "other", "k", l, 0); d.Remaining != 10 {
		t.Fatalf("a refusal above a floor consumed elsewhere: %s", Describe(d))
	}
	top := 0
	for range 10 {
		if take1(t, s, "r", "k", l, 1).Allowed {
			top++
		}
	}
	if top != 4 {
		t.Fatalf("the top tier took %d of the 4 kept for it", top)
	}
}

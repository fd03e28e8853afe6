package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// Every reservation the store admits can be settled until its deadline:
// random opens (with random deadlines), settles and clock moves on a small
// bound, checked against a model of what is open. When the open ones fill
// the bound, a new reservation is refused before anything is taken, never
// admitted unrecorded.
func TestEveryAdmittedReservationCanBeSettled(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clock := sluice.NewManualClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	const bound = 16
	s := New(WithClock(clock), WithMaxHolds(bound))
	l := sluice.Limit{Rate: 1 << 40, Period: time.Hour * 10000}
	open := map[string]int64{} // the model: id -> deadline
	out := make([]sluice.Decision, 1)
	take := func(tk sluice.Take) sluice.Decision {
		if err := s.Take(context.Background(), []sluice.Take{tk}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	next := 0
	for step := range 20000 {
		now := clock.Now()
		for id, until := range open {
			if now >= until {
				delete(open, id)
			}
		}
		switch op := rng.IntN(10); {
		case op < 5: // open
			id := fmt.Sprint(next)
			next++
			hold := time.Duration(1+rng.IntN(50)) * time.Millisecond
			d := take(sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1, Hold: id, HoldFor: hold})
			switch {
			case d.Allowed && len(open) >= bound:
				t.Fatalf("step %d: reservation %s admitted with %d open on a bound of %d: it cannot be recorded", step, id, len(open), bound)
			case !d.Allowed && len(open) < bound:
				t.Fatalf("step %d: reservation %s refused (%v) with %d open on a bound of %d", step, id, d.Reason, len(open), bound)
			case !d.Allowed && (d.Reason != sluice.ReasonUnavailable || d.RetryAfter <= 0):
				t.Fatalf("step %d: refused as %v, retry %v", step, d.Reason, d.RetryAfter)
			case d.Allowed:
				open[id] = now + int64(hold)
			}
		case op < 8 && len(open) > 0: // settle one that is open
			for id := range open {
				d := take(sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1, Hold: id, Settle: true})
				if d.Reason == sluice.ReasonNoReservation {
					t.Fatalf("step %d: reservation %s, admitted and open until %v, was not found at %v", step, id, open[id], now)
				}
				delete(open, id)
				break
			}
		default:
			clock.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		if got := s.OpenHolds(); got > bound {
			t.Fatalf("step %d: %d open on a bound of %d", step, got, bound)
		}
	}
	if s.RefusedHolds() == 0 {
		t.Fatal("the bound was never reached: the test shows nothing")
	}
}

// BenchmarkReservationAtTheBound measures a reservation refused because the
// default bound (2^18) is full of live ones: one look at the earliest
// deadline, not a scan of the table.
func BenchmarkReservationAtTheBound(b *testing.B) {
	clock := sluice.NewManualClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	s := New(WithClock(clock))
	l := sluice.Limit{Rate: 1 << 40, Period: time.Hour * 10000}
	out := make([]sluice.Decision, 1)
	for i := range DefaultMaxHolds {
		s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1, Hold: fmt.Sprint(i), HoldFor: time.Hour}}, out)
	}
	if s.OpenHolds() != DefaultMaxHolds {
		b.Fatalf("%d open, want the bound %d", s.OpenHolds(), DefaultMaxHolds)
	}
	tk := []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1, Hold: "one-more", HoldFor: time.Hour}}
	for b.Loop() {
		if err := s.Take(context.Background(), tk, out); err != nil || out[0].Allowed {
			b.Fatalf("beyond the bound: %+v, %v", out[0], err)
		}
	}
}

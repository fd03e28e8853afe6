package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// holdTake is a take that opens (settle false) or settles a reservation.
func holdTake(rule, key string, l sluice.Limit, cost int64, id string, holdFor time.Duration, settle bool) sluice.Take {
	return sluice.Take{Rule: rule, Key: key, Limit: l, Cost: cost, Hold: id, HoldFor: holdFor, Settle: settle}
}

func call1(t *testing.T, s sluice.Store, tk sluice.Take) sluice.Decision {
	t.Helper()
	var out [1]sluice.Decision
	if err := s.Take(context.Background(), []sluice.Take{tk}, out[:]); err != nil {
		t.Fatalf("Take(%+v): %v", tk, err)
	}
	return out[0]
}

// testReservationsMatchAlgo runs random reservations, settles (under,
// over and at the estimate), cancels, late settles and plain takes against
// algo's model, where a settle is a refund or a charge of the difference.
func testReservationsMatchAlgo(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(l.String(), func(t *testing.T) {
			clock, s, p := againstModel(t, newStore, l)
			model := algo.NewState(p)
			type open struct {
				id       string
				estimate int64
				until    int64
			}
			var opens []open
			rng := rand.New(rand.NewPCG(uint64(l.Algorithm), 7))
			check := func(i int, what string, d sluice.Decision, want algo.Result) {
				t.Helper()
				if !sameDecision(d, want) {
					t.Fatalf("step %d %s: store %s, algo %+v", i, what, Describe(d), want)
				}
			}
			for i := range 400 {
				advance(clock, time.Duration(rng.Int64N(max(p.T, p.W/int64(max(p.Burst, 1)))*2)))
				now := clock.Now()
				switch op := rng.IntN(6); {
				case op <= 1: // reserve
					est := 1 + rng.Int64N(max(p.Burst/2, 1))
					id := fmt.Sprintf("h%d", i)
					holdFor := time.Duration(1+rng.Int64N(4)) * max(time.Duration(p.T), time.Duration(p.W)/4)
					d := call1(t, s, holdTake("r", "k", l, est, id, holdFor, false))
					var want algo.Result
					model.Take(now, est, &want)
					check(i, "reserve "+id, d, want)
					if d.Allowed {
						opens = append(opens, open{id, est, now + int64(holdFor)})
					}
				case op <= 3 && len(opens) > 0: // settle, cancel or settle late
					j := rng.IntN(len(opens))
					o := opens[j]
					opens = append(opens[:j], opens[j+1:]...)
					actual := rng.Int64N(3 * o.estimate)
					d := call1(t, s, holdTake("r", "k", l, actual, o.id, 0, true))
					var want algo.Result
					if now < o.until {
						if delta := actual - o.estimate; delta < 0 {
							model.Refund(now, -delta)
						} else if delta > 0 {
							model.Charge(now, delta)
						}
						model.Take(now, 0, &want)
						want.Applied() // even into debt
					} else {
						model.Take(now, 0, &want)
						want.Applied()
						want.Allowed, want.Reason = false, sluice.ReasonNoReservation
					}
					check(i, fmt.Sprintf("settle %s at %d (estimate %d)", o.id, actual, o.estimate), d, want)
					if d := call1(t, s, holdTake("r", "k", l, actual, o.id, 0, true)); d.Allowed || d.Reason != sluice.ReasonNoReservation {
						t.Fatalf("step %d: settled %s twice: %s", i, o.id, Describe(d))
					}
				default:
					cost := rng.Int64N(3)
					d := call1(t, s, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: cost})
					var want algo.Result
					model.Take(now, cost, &want)
					check(i, fmt.Sprintf("take %d", cost), d, want)
				}
			}
		})
	}
}

// testSettleOnce settles one reservation from many goroutines at once:
// exactly one settles it, and the key ends as if it was settled once.
func testSettleOnce(t *testing.T, newStore Factory) {
	l := sluice.Limit{Rate: 100, Period: time.Minute, Burst: 100}
	s := newStore(t, sluice.NewManualClock(Epoch))
	call1(t, s, holdTake("r", "k", l, 50, "once", time.Minute, false))
	var won atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			var out [1]sluice.Decision
			if err := s.Take(context.Background(), []sluice.Take{holdTake("r", "k", l, 10, "once", 0, true)}, out[:]); err != nil {
				t.Error(err)
			} else if out[0].Allowed {
				won.Add(1)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 {
		t.Fatalf("%d settles of one reservation succeeded, want 1", won.Load())
	}
	if d := take1(t, s, "r", "k", l, 0); d.Remaining != 90 {
		t.Fatalf("after one settle at 10 of 50 reserved: %s, want 90 remaining", Describe(d))
	}
}

// testRefusedCallOpensNothing: a reservation in a call another take
// refuses is not opened; a cancelled one cannot be settled.
func testRefusedCallOpensNothing(t *testing.T, newStore Factory) {
	l := sluice.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	s := newStore(t, sluice.NewManualClock(Epoch))
	take1(t, s, "full", "k", l, 10)
	out := make([]sluice.Decision, 2)
	if err := s.Take(context.Background(), []sluice.Take{
		holdTake("r", "k", l, 5, "refused", time.Minute, false),
		{Rule: "full", Key: "k", Limit: l, Cost: 1},
	}, out); err != nil {
		t.Fatal(err)
	}
	if out[1].Allowed {
		t.Fatalf("the full key admitted: %s", Describe(out[1]))
	}
	if d := call1(t, s, holdTake("r", "k", l, 0, "refused", 0, true)); d.Reason != sluice.ReasonNoReservation {
		t.Fatalf("a refused call opened its reservation: settle answered %s", Describe(d))
	}
	if d := take1(t, s, "r", "k", l, 0); d.Remaining != 10 {
		t.Fatalf("the refused call consumed: %s", Describe(d))
	}
	call1(t, s, holdTake("r", "k", l, 5, "cancelled", time.Minute, false))
	call1(t, s, holdTake("r", "k", l, -5, "cancelled", 0, false))
	if d := call1(t, s, holdTake("r", "k", l, 0, "cancelled", 0, true)); d.Reason != sluice.ReasonNoReservation {
		t.Fatalf("a cancelled reservation settled again: %s", Describe(d))
	}
	if d := take1(t, s, "r", "k", l, 0); d.Remaining != 10 {
		t.Fatalf("after a cancel: %s, want 10 remaining", Describe(d))
	}
}

// testDebtMakesLaterTakesWait: a settle beyond the estimate and beyond
// what is left leaves the key in debt.
func testDebtMakesLaterTakesWait(t *testing.T, newStore Factory) {
	l := sluice.Limit{Rate: 10, Period: time.Second, Burst: 10}
	clock := sluice.NewManualClock(Epoch)
	s := newStore(t, clock)
	call1(t, s, holdTake("r", "k", l, 5, "big", time.Minute, false))
	if d := call1(t, s, holdTake("r", "k", l, 25, "big", 0, true)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("settle beyond the limit: %s, want settled with 0 remaining", Describe(d))
	}
	d := take1(t, s, "r", "k", l, 1)
	if d.Allowed || d.RetryAfter != 1600*time.Millisecond {
		t.Fatalf("take in debt of 15: %s, want refused for 1.6s", Describe(d))
	}
	advance(clock, 1600*time.Millisecond)
	if d := take1(t, s, "r", "k", l, 1); !d.Allowed {
		t.Fatalf("after the debt is paid: %s", Describe(d))
	}
}

// testReservationEdges: a reservation is open until, not at, its deadline;
// a peek with a reservation id neither opens nor closes one; an id of
// MaxHoldLen bytes is taken.
func testReservationEdges(t *testing.T, newStore Factory) {
	l := sluice.Limit{Rate: 100, Period: time.Hour, Burst: 100}
	clock := sluice.NewManualClock(Epoch)
	s := newStore(t, clock)
	call1(t, s, holdTake("r", "k", l, 10, "edge", time.Second, false))
	advance(clock, time.Second)
	if d := call1(t, s, holdTake("r", "k", l, 0, "edge", 0, true)); d.Reason != sluice.ReasonNoReservation {
		t.Fatalf("a settle at the deadline: %s, want no reservation (open until, not at, the deadline)", Describe(d))
	}
	call1(t, s, holdTake("r", "k", l, 0, "peek", time.Minute, false)) // opens nothing
	if d := call1(t, s, holdTake("r", "k", l, 5, "peek", 0, true)); d.Reason != sluice.ReasonNoReservation {
		t.Fatalf("a peek opened a reservation: settle answered %s", Describe(d))
	}
	call1(t, s, holdTake("r", "k", l, 10, "kept", time.Minute, false))
	call1(t, s, holdTake("r", "k", l, 0, "kept", time.Minute, false)) // a peek does not close it
	if d := call1(t, s, holdTake("r", "k", l, 0, "kept", 0, true)); !d.Allowed {
		t.Fatalf("a peek closed a reservation: settle answered %s", Describe(d))
	}
	long := strings.Repeat("x", sluice.MaxHoldLen)
	if d := call1(t, s, holdTake("r", "k2", l, 1, long, time.Minute, false)); !d.Allowed {
		t.Fatalf("an id of MaxHoldLen bytes: %s", Describe(d))
	}
	if d := call1(t, s, holdTake("r", "k2", l, 0, long, 0, true)); !d.Allowed {
		t.Fatalf("settling an id of MaxHoldLen bytes: %s", Describe(d))
	}
}

// testChargesMatchAlgo: a charge applies its units whatever the limit says
// (a debt, as algo's Charge), whatever the other takes of its call decide,
// and later takes see it, on random traffic for every algorithm. A take of
// 0 units on a key in debt is refused until the debt is paid off (algo's
// Take), and a charge is answered allowed even into debt.
func testChargesMatchAlgo(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(l.String(), func(t *testing.T) {
			clock, s, p := againstModel(t, newStore, l)
			model := algo.NewState(p)
			rng := rand.New(rand.NewPCG(uint64(l.Algorithm), 7))
			for i := range 300 {
				advance(clock, time.Duration(rng.Int64N(p.T+1)))
				if rng.IntN(3) == 0 {
					units := 1 + rng.Int64N(p.Burst*2)
					// With a take that is refused in the same call: the
					// charge applies all the same.
					out := make([]sluice.Decision, 2)
					err := s.Take(context.Background(), []sluice.Take{
						{Rule: "r", Key: "k", Limit: l, Cost: units, Charge: true},
						{Rule: "r", Key: "other", Limit: l, Cost: p.Burst + 1},
					}, out)
					if err != nil {
						t.Fatal(err)
					}
					model.Charge(clock.Now(), units)
					var want algo.Result
					model.Take(clock.Now(), 0, &want)
					if !out[0].Allowed || out[0].Remaining != want.Remaining || out[0].RetryAfter != 0 {
						t.Fatalf("step %d: charge of %d: %s, want allowed with %d remaining", i, units, Describe(out[0]), want.Remaining)
					}
					continue
				}
				cost := rng.Int64N(2) // 0: is the key over its limit?
				d := take1(t, s, "r", "k", l, cost)
				var want algo.Result
				model.Take(clock.Now(), cost, &want)
				if !sameDecision(d, want) {
					t.Fatalf("step %d: take after charges: store %s, algo %+v", i, Describe(d), want)
				}
			}
		})
	}
}

// testZeroCostAtTheDebtsEdges: a take of 0 units asks whether the key is
// over its limit. At the limit it is allowed; one unit charged beyond it,
// refused, as algo answers, until the debt is paid off: still refused one
// step of the store's resolution before, allowed at that instant.
func testZeroCostAtTheDebtsEdges(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(l.String(), func(t *testing.T) {
			clock, s, p := againstModel(t, newStore, l)
			model := algo.NewState(p)
			var want algo.Result
			for {
				d := take1(t, s, "r", "k", l, 1)
				if model.Take(clock.Now(), 1, &want); !sameDecision(d, want) {
					t.Fatalf("filling: store %s, algo %+v", Describe(d), want)
				}
				if !d.Allowed {
					break
				}
			}
			check := func(what string) sluice.Decision {
				t.Helper()
				d := take1(t, s, "r", "k", l, 0)
				if model.Take(clock.Now(), 0, &want); !sameDecision(d, want) {
					t.Fatalf("%s: store %s, algo %+v", what, Describe(d), want)
				}
				return d
			}
			if d := check("at the limit"); !d.Allowed {
				t.Fatalf("at the limit: %s, want allowed", Describe(d))
			}
			if d := call1(t, s, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1, Charge: true}); !d.Allowed {
				t.Fatalf("a charge: %s, want allowed", Describe(d))
			}
			model.Charge(clock.Now(), 1)
			d := check("one unit in debt")
			if l.Algorithm == sluice.SlidingLog {
				return // a log holds at most its limit: never over it
			}
			if d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("one unit in debt: %s, want refused", Describe(d))
			}
			clock.Advance(d.RetryAfter - resolution)
			if d := check("just before the debt is paid off"); d.Allowed {
				t.Fatalf("just before the debt is paid off: %s, want refused", Describe(d))
			}
			clock.Advance(resolution)
			if d := check("when the debt is paid off"); !d.Allowed {
				t.Fatalf("when the debt is paid off: %s, want allowed", Describe(d))
			}
		})
	}
}

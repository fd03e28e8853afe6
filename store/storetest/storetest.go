// Package storetest is the conformance suite every [sluice.Store] must pass:
// decisions identical to package algo on random traffic, exactness under
// concurrency, independence of keys and rules, all-or-nothing multi-key
// takes, expiry, reservations settled exactly once, and a key's usage
// carried when its limit changes.
//
// A store's test calls [Run] with a factory that builds a fresh, empty store
// reading time from the given clock:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
//			return memory.New(memory.WithClock(c))
//		})
//	}
package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/internal/view"
)

// Factory returns a new, empty store that reads time from clock. It may
// register cleanups with t.
type Factory func(t *testing.T, clock sluice.Clock) sluice.Store

// Epoch is the time the suite's clocks start at.
var Epoch = time.Date(2026, 11, 29, 10, 15, 0, 0, time.UTC)

// Options adapt the suite to a store.
type Options struct {
	// Resolution is the store's time resolution (the Redis store counts
	// whole microseconds). The suite moves its clocks in multiples of it, so
	// that decisions stay identical to package algo's.
	Resolution time.Duration
}

// resolution is the current run's, for the helpers; the suite's tests do
// not run in parallel.
var resolution = time.Duration(1)

// advance moves the clock by d, rounded up to the store's resolution.
func advance(c *sluice.ManualClock, d time.Duration) {
	if r := resolution; r > 1 {
		d = (d + r - 1) / r * r
	}
	c.Advance(d)
}

// Run runs the whole suite against the stores newStore makes.
func Run(t *testing.T, newStore Factory) { RunWith(t, newStore, Options{}) }

// RunWith runs the suite with options.
func RunWith(t *testing.T, newStore Factory, o Options) {
	resolution = max(o.Resolution, 1)
	defer func() { resolution = 1 }()
	t.Run("MatchesAlgoOnRandomTraffic", func(t *testing.T) { testMatchesAlgo(t, newStore) })
	t.Run("ConcurrentTakesOnOneKeyAdmitExactlyTheLimit", func(t *testing.T) { testConcurrentExact(t, newStore) })
	t.Run("KeysAndRulesAreIndependent", func(t *testing.T) { testIndependence(t, newStore) })
	t.Run("MultiTakeIsAllOrNothing", func(t *testing.T) { testMultiTakeAtomic(t, newStore) })
	t.Run("SameKeyTwiceInOneCallCountsTwice", func(t *testing.T) { testSameKeyTwice(t, newStore) })
	t.Run("ConcurrentMultiTakesStayExact", func(t *testing.T) { testConcurrentMultiTake(t, newStore) })
	t.Run("KeysExpireBackToFull", func(t *testing.T) { testExpiry(t, newStore) })
	t.Run("DryRunsConsumeNothing", func(t *testing.T) { testDryRun(t, newStore) })
	t.Run("RefundsGiveUnitsBack", func(t *testing.T) { testRefunds(t, newStore) })
	t.Run("BadTakesAreErrors", func(t *testing.T) { testBadTakes(t, newStore) })
	t.Run("ReservationsMatchAlgo", func(t *testing.T) { testReservationsMatchAlgo(t, newStore) })
	t.Run("ASettleAppliesOnce", func(t *testing.T) { testSettleOnce(t, newStore) })
	t.Run("RefusedCallsOpenNoReservation", func(t *testing.T) { testRefusedCallOpensNothing(t, newStore) })
	t.Run("DebtMakesLaterTakesWait", func(t *testing.T) { testDebtMakesLaterTakesWait(t, newStore) })
	t.Run("ChargesMatchAlgo", func(t *testing.T) { testChargesMatchAlgo(t, newStore) })
	t.Run("ZeroCostAtTheDebtsEdges", func(t *testing.T) { testZeroCostAtTheDebtsEdges(t, newStore) })
	t.Run("ReservationEdges", func(t *testing.T) { testReservationEdges(t, newStore) })
	t.Run("FloorsMatchAlgo", func(t *testing.T) { testFloorsMatchAlgo(t, newStore) })
	t.Run("FloorsKeepTheShareAbove", func(t *testing.T) { testFloorsKeepTheShareAbove(t, newStore) })
	t.Run("KeysAreNotKeptPastTheCall", func(t *testing.T) { testKeysAreNotKeptPastTheCall(t, newStore) })
	t.Run("SharesMatchAlgo", func(t *testing.T) { testSharesMatchAlgo(t, newStore) })
	t.Run("CarryMatchesAlgo", func(t *testing.T) { testCarryMatchesAlgo(t, newStore) })
	t.Run("CarryRaiseAndLower", func(t *testing.T) { testCarryRaiseAndLower(t, newStore) })
	t.Run("CarryConcurrent", func(t *testing.T) { testCarryConcurrent(t, newStore) })
	t.Run("CarryLeavesACopy", func(t *testing.T) { testCarryLeavesACopy(t, newStore) })
}

// limits returns one small limit per algorithm, and a region's part of a
// global token bucket (sluice.Limit.Portion).
func limits() []sluice.Limit {
	var ls []sluice.Limit
	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Rate: 5, Period: time.Second, Algorithm: a}
		if a.IsBucket() {
			l.Burst = 8
		}
		ls = append(ls, l)
	}
	return append(ls, sluice.Limit{Rate: 5, Period: time.Second, Burst: 8, Algorithm: sluice.TokenBucket, Portion: 625})
}

// nameOf names a limit's subtest: its algorithm, and its portion if any.
func nameOf(l sluice.Limit) string {
	if l.Portion > 0 {
		return fmt.Sprintf("%s-portion-%d", l.Algorithm, l.Portion)
	}
	return l.Algorithm.String()
}

// capacityOf is what a fresh key of l holds: its burst, or a region's own
// share of it.
func capacityOf(l sluice.Limit) int64 {
	if l.Portion > 0 {
		return l.Capacity() * l.Portion / 1000
	}
	return l.Capacity()
}

// withCalendars is limits and the calendar windows (UTC days, weeks from
// Monday, months, years), whose boundaries random traffic crosses in steps
// of up to two periods.
func withCalendars() []sluice.Limit {
	ls := limits()
	for _, per := range []time.Duration{sluice.CalendarDay, sluice.CalendarWeek, sluice.CalendarMonth, sluice.CalendarYear} {
		ls = append(ls, sluice.Limit{Rate: 5, Period: per, Algorithm: sluice.FixedWindow, Calendar: true})
	}
	return ls
}

func take1(t *testing.T, s sluice.Store, rule, key string, l sluice.Limit, cost int64) sluice.Decision {
	t.Helper()
	return call1(t, s, sluice.Take{Rule: rule, Key: key, Limit: l, Cost: cost})
}

// sameDecision compares a store's decision with algo's, its durations
// rounded up to the store's resolution (a store counting microseconds
// answers with the first microsecond at which a wait is over).
func sameDecision(d sluice.Decision, r algo.Result) bool {
	up := func(ns int64) int64 {
		res := int64(resolution)
		return (ns + res - 1) / res * res
	}
	return d.Allowed == r.Allowed && d.Reason == r.Reason && d.Remaining == r.Remaining &&
		int64(d.RetryAfter) == up(r.RetryAfter) && int64(d.ResetAfter) == up(r.ResetAfter) && int64(d.Delay) == up(r.Delay)
}

// againstModel starts a store on a manual clock at Epoch and returns it
// with the limit's parameters, for a test that checks it against package
// algo's model.
func againstModel(t *testing.T, newStore Factory, l sluice.Limit) (*sluice.ManualClock, sluice.Store, algo.Params) {
	t.Helper()
	clock := sluice.NewManualClock(Epoch)
	p, err := algo.NewParams(l)
	if err != nil {
		t.Fatal(err)
	}
	return clock, newStore(t, clock), p
}

func testMatchesAlgo(t *testing.T, newStore Factory) {
	for _, l := range withCalendars() {
		t.Run(l.String(), func(t *testing.T) {
			clock, s, p := againstModel(t, newStore, l)
			keys := []string{"u1", "u2", "u3"}
			models := map[string]*algo.State{}
			for _, k := range keys {
				models[k] = algo.NewState(p)
			}
			rng := rand.New(rand.NewPCG(uint64(l.Algorithm), 1))
			for i := range 400 {
				switch rng.IntN(4) {
				case 0:
				case 1:
					advance(clock, time.Duration(rng.Int64N(p.T+p.W/10)))
				case 2:
					advance(clock, time.Duration(rng.Int64N(2*p.W)))
				default:
					advance(clock, time.Duration(rng.Int64N(int64(time.Millisecond))))
				}
				k := keys[rng.IntN(len(keys))]
				cost := int64(1)
				if rng.IntN(5) == 0 {
					cost = rng.Int64N(p.Burst + 2)
				}
				d := take1(t, s, "r", k, l, cost)
				var want algo.Result
				models[k].Take(clock.Now(), cost, &want)
				if !sameDecision(d, want) {
					t.Fatalf("step %d key %s cost %d: store %+v, algo %+v", i, k, cost, d, want)
				}
				if d.Rule != "r" || d.Limit != l {
					t.Fatalf("decision names rule %q limit %v, want r, %v", d.Rule, d.Limit, l)
				}
			}
		})
	}
}

// testConcurrentExact fires many more takes than the limit at one key, from
// many goroutines, at one instant: exactly as many are admitted as a
// sequential run admits.
func testConcurrentExact(t *testing.T, newStore Factory) {
	const goroutines, each = 64, 16
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			l.Rate, l.Period = 100, time.Hour
			if l.Algorithm.IsBucket() {
				l.Burst = 100
			}
			s := newStore(t, sluice.NewManualClock(Epoch))
			want := 0
			for range goroutines * each {
				if take1(t, s, "r", "sequential", l, 1).Allowed {
					want++
				}
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for range goroutines {
				wg.Go(func() {
					var out [1]sluice.Decision
					for range each {
						if err := s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "hot", Limit: l, Cost: 1}}, out[:]); err != nil {
							errs <- err
							return
						}
						if out[0].Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != int64(want) || int64(want) < capacityOf(l) {
				t.Fatalf("%d concurrent takes admitted %d, a sequential run %d (limit 100)", goroutines*each, got, want)
			}
		})
	}
}

func testIndependence(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch))
			for take1(t, s, "r1", "a", l, 1).Allowed {
			}
			fresh := take1(t, s, "r1", "zz", l, 0).Remaining
			if got := take1(t, s, "r1", "b", l, 0).Remaining; got != fresh {
				t.Fatalf("key b has %d remaining after key a was drained, want %d", got, fresh)
			}
			if got := take1(t, s, "r2", "a", l, 0).Remaining; got != fresh {
				t.Fatalf("key a under rule r2 has %d remaining after r1 drained it, want %d", got, fresh)
			}
			if d := take1(t, s, "r1", "a", l, 1); d.Allowed {
				t.Fatalf("drained key admitted: %+v", d)
			}
		})
	}
}

// A store does not keep a key's bytes past its call (sluice.Store): callers
// pass keys that are views of a buffer they reuse. Each take's rule, key
// and reservation id here are views of one buffer, overwritten with another
// key's bytes as soon as Take returns; the state of the key taken must stay
// where the takes left it, and the other key must stay fresh.
func testKeysAreNotKeptPastTheCall(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch))
			fresh := take1(t, s, "rule-a", "key-aaaa", l, 0).Remaining
			buf := []byte("rule-akey-aaaahold-aaaa")
			for i := range 3 {
				takes := []sluice.Take{{Rule: view.String(buf[:6]), Key: view.String(buf[6:14]), Limit: l, Cost: 1}}
				if i == 2 {
					takes[0].Hold, takes[0].HoldFor = view.String(buf[14:]), time.Minute
				}
				out := make([]sluice.Decision, 1)
				if err := s.Take(context.Background(), takes, out); err != nil || !out[0].Allowed {
					t.Fatalf("take %d: %v %+v", i, err, out[0])
				}
				copy(buf, "rule-bkey-bbbbhold-bbbb") // the caller reuses its buffer
				if got := take1(t, s, "rule-b", "key-bbbb", l, 0).Remaining; got != fresh {
					t.Fatalf("after take %d, another key (the buffer's new bytes) has %d left, want a fresh %d: the store kept a view of the key", i, got, fresh)
				}
				copy(buf, "rule-akey-aaaahold-aaaa")
			}
			copy(buf, "rule-bkey-bbbbhold-bbbb")
			for range 3 { // the same takes with keys of their own: what key-aaaa must have
				take1(t, s, "rule-c", "key-cccc", l, 1)
			}
			want := take1(t, s, "rule-c", "key-cccc", l, 0).Remaining
			if got := take1(t, s, "rule-a", "key-aaaa", l, 0).Remaining; got != want || want == fresh {
				t.Fatalf("key-aaaa has %d left after 3 takes, want %d (fresh: %d)", got, want, fresh)
			}
			settle := sluice.Take{Rule: "rule-a", Key: "key-aaaa", Limit: l, Cost: 1, Hold: "hold-aaaa", Settle: true}
			out := make([]sluice.Decision, 1)
			if err := s.Take(context.Background(), []sluice.Take{settle}, out); err != nil || out[0].Reason == sluice.ReasonNoReservation {
				t.Fatalf("the reservation opened under a reused buffer is not found by its id: %v %+v", err, out[0])
			}
		})
	}
}

func testMultiTakeAtomic(t *testing.T, newStore Factory) {
	ctx := context.Background()
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch))
			tight := sluice.Limit{Rate: 1, Period: time.Hour, Algorithm: sluice.GCRA}
			takes := []sluice.Take{
				{Rule: "loose", Key: "u", Limit: l, Cost: 2}, // 2: a leaky queue sends one at once
				{Rule: "tight", Key: "u", Limit: tight, Cost: 1},
				{Rule: "loose2", Key: "v", Limit: l, Cost: 2},
			}
			out := make([]sluice.Decision, 3)
			before := take1(t, s, "loose", "u", l, 0).Remaining
			if err := s.Take(ctx, takes, out); err != nil {
				t.Fatal(err)
			}
			if !out[0].Allowed || !out[1].Allowed || !out[2].Allowed {
				t.Fatalf("first multi-take: %+v", out)
			}
			if out[1].Rule != "tight" || out[2].Rule != "loose2" {
				t.Fatalf("decisions out of order: %+v", out)
			}
			mid := take1(t, s, "loose", "u", l, 0).Remaining
			mid2 := take1(t, s, "loose2", "v", l, 0).Remaining
			if mid >= before {
				t.Fatalf("allowed multi-take consumed nothing from loose: %d -> %d", before, mid)
			}
			for range 3 { // tight is exhausted: each try must consume nothing elsewhere
				if err := s.Take(ctx, takes, out); err != nil {
					t.Fatal(err)
				}
				if out[1].Allowed || out[1].Reason != sluice.ReasonLimited {
					t.Fatalf("tight rule allowed twice in an hour: %+v", out[1])
				}
				if !out[0].Allowed || out[0].Remaining != mid {
					t.Fatalf("loose decision in a denied take: %+v, want allowed with %d remaining (nothing consumed)", out[0], mid)
				}
			}
			if got := take1(t, s, "loose", "u", l, 0).Remaining; got != mid {
				t.Fatalf("denied multi-takes consumed from loose: %d -> %d", mid, got)
			}
			if got := take1(t, s, "loose2", "v", l, 0).Remaining; got != mid2 {
				t.Fatalf("denied multi-takes consumed from loose2: %d -> %d", mid2, got)
			}
		})
	}
}

// testSameKeyTwice: two takes of one (rule, key) in one call are applied in
// order, each seeing the one before, like two calls; if either is refused,
// neither consumes anything.
func testSameKeyTwice(t *testing.T, newStore Factory) {
	ctx := context.Background()
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch))
			pair := []sluice.Take{{Rule: "r", Key: "u", Limit: l, Cost: 2}, {Rule: "r", Key: "u", Limit: l, Cost: 2}}
			out := make([]sluice.Decision, 2)
			pairs := 0
			for range 20 {
				before := take1(t, s, "r", "u", l, 0).Remaining
				if err := s.Take(ctx, pair, out); err != nil {
					t.Fatal(err)
				}
				after := take1(t, s, "r", "u", l, 0).Remaining
				if out[0].Allowed && out[1].Allowed {
					pairs++
					// The reference: the same takes in two calls on a key
					// of its own, in step.
					take1(t, s, "r", "ref", l, 2)
					take1(t, s, "r", "ref", l, 2)
					if ref := take1(t, s, "r", "ref", l, 0).Remaining; after != ref {
						t.Fatalf("pair %d left %d, two calls leave %d", pairs, after, ref)
					}
					continue
				}
				if after != before {
					t.Fatalf("a refused pair consumed: %d -> %d (%+v)", before, after, out)
				}
				break
			}
			if want := capacityOf(l) / 4; l.Algorithm != sluice.LeakyQueue && int64(pairs) != want {
				t.Fatalf("%d pairs of 2+2 admitted on a capacity of %d, want %d", pairs, capacityOf(l), want)
			}
		})
	}
}

// testConcurrentMultiTake: takes from two rules at once, concurrently; the
// tighter rule admits exactly its limit and the looser loses exactly as many.
func testConcurrentMultiTake(t *testing.T, newStore Factory) {
	ctx := context.Background()
	s := newStore(t, sluice.NewManualClock(Epoch))
	a := sluice.Limit{Rate: 50, Period: time.Hour, Algorithm: sluice.SlidingLog}
	b := sluice.Limit{Rate: 100, Period: time.Hour, Algorithm: sluice.GCRA}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			out := make([]sluice.Decision, 2)
			takes := []sluice.Take{{Rule: "a", Key: "k", Limit: a, Cost: 1}, {Rule: "b", Key: "k", Limit: b, Cost: 1}}
			if g%2 == 1 {
				takes[0], takes[1] = takes[1], takes[0] // opposite orders must not deadlock
			}
			for range 20 {
				if err := s.Take(ctx, takes, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed && out[1].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 50 {
		t.Fatalf("640 concurrent multi-takes admitted %d, want exactly 50", got)
	}
	if got := take1(t, s, "b", "k", b, 0).Remaining; got != 50 {
		t.Fatalf("rule b has %d remaining, want 50: denied takes consumed from it", got)
	}
}

func testExpiry(t *testing.T, newStore Factory) {
	for _, l := range withCalendars() {
		t.Run(l.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(Epoch)
			s := newStore(t, clock)
			full := take1(t, s, "r", "k", l, 0).Remaining
			var last sluice.Decision
			for {
				d := take1(t, s, "r", "k", l, 1)
				if !d.Allowed {
					break
				}
				last = d
			}
			if last.ResetAfter <= 0 {
				t.Fatalf("drained key reports reset-after %v", last.ResetAfter)
			}
			advance(clock, last.ResetAfter)
			if d := take1(t, s, "r", "k", l, 0); d.Remaining != full || d.ResetAfter != 0 {
				t.Fatalf("after reset-after %v: %+v, want %d remaining and idle", last.ResetAfter, d, full)
			}
			clock.Advance(1000 * time.Hour)
			if d := take1(t, s, "r", "k", l, full); !d.Allowed {
				t.Fatalf("full burst after a long idle time: %+v", d)
			}
		})
	}
}

// testDryRun: a dry run decides exactly as the real take would, alone or in
// a multi-key take, and consumes nothing.
func testDryRun(t *testing.T, newStore Factory) {
	ctx := context.Background()
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch))
			other := sluice.Limit{Rate: 100, Period: time.Hour}
			out := make([]sluice.Decision, 2)
			for i := range 12 {
				before := take1(t, s, "r", "k", l, 0)
				takes := []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 2, DryRun: true}, {Rule: "o", Key: "k", Limit: other, Cost: 1}}
				if err := s.Take(ctx, takes[:1+i%2], out); err != nil {
					t.Fatal(err)
				}
				dry := out[0]
				if after := take1(t, s, "r", "k", l, 0); after != before {
					t.Fatalf("step %d: dry run consumed: %s -> %s", i, Describe(before), Describe(after))
				}
				real := take1(t, s, "r", "k", l, 2)
				if dry.Allowed != real.Allowed || dry.RetryAfter != real.RetryAfter {
					t.Fatalf("step %d: dry run %s, real take %s", i, Describe(dry), Describe(real))
				}
			}
		})
	}
}

// testRefunds: a negative cost gives units back, never beyond a fresh key.
func testRefunds(t *testing.T, newStore Factory) {
	for _, l := range limits() {
		t.Run(nameOf(l), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch))
			fresh := take1(t, s, "r", "k", l, 0)
			take1(t, s, "r", "k", l, 3)
			take1(t, s, "r", "k", l, -3)
			if got := take1(t, s, "r", "k", l, 0); got.Remaining != fresh.Remaining {
				t.Fatalf("take 3, refund 3: %s, fresh %s", Describe(got), Describe(fresh))
			}
			take1(t, s, "r", "k", l, -100)
			if got := take1(t, s, "r", "k", l, 0); got.Remaining != fresh.Remaining {
				t.Fatalf("over-refunded: %s, fresh %s", Describe(got), Describe(fresh))
			}
			for take1(t, s, "r", "k", l, 1).Allowed {
			}
			take1(t, s, "r", "k", l, -1)
			if d := take1(t, s, "r", "k", l, 1); !d.Allowed {
				t.Fatalf("a refunded unit cannot be taken again: %s", Describe(d))
			}
		})
	}
}

func testBadTakes(t *testing.T, newStore Factory) {
	s := newStore(t, sluice.NewManualClock(Epoch))
	ctx := context.Background()
	good := sluice.Limit{Rate: 5, Period: time.Second}
	for name, tk := range map[string]sluice.Take{
		"invalid limit": {Rule: "r", Key: "k", Limit: sluice.Limit{Rate: 0, Period: time.Second}, Cost: 1},
	} {
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Take{tk}, out); err == nil {
			t.Errorf("%s: no error (decision %+v)", name, out[0])
		}
	}
	if err := s.Take(ctx, []sluice.Take{{Rule: "r", Key: "k", Limit: good, Cost: 1}}, nil); err == nil {
		t.Error("no room for decisions: no error")
	}
	if d := take1(t, s, "r", "k", good, 0); d.Remaining != 5 {
		t.Errorf("a failed take consumed: %+v", d)
	}
}

// Describe returns a one-line description of a decision, for failure messages.
func Describe(d sluice.Decision) string {
	return fmt.Sprintf("%s allowed=%v reason=%v remaining=%d retry=%v reset=%v", d.Rule, d.Allowed, d.Reason, d.Remaining, d.RetryAfter, d.ResetAfter)
}

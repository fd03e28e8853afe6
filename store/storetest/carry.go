package storetest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// carryLimits returns, for algorithm a, limits a key's limit changes
// between: raised, lowered, other bursts and other windows. Their emission
// intervals are whole microseconds, so that a store counting microseconds
// decides exactly as package algo.
func carryLimits(a sluice.Algorithm) []sluice.Limit {
	ls := []sluice.Limit{
		{Rate: 5, Period: time.Second},
		{Rate: 10, Period: time.Second},
		{Rate: 2, Period: time.Second},
		{Rate: 8, Period: 2 * time.Second},
		{Rate: 4, Period: 500 * time.Millisecond},
	}
	for i := range ls {
		ls[i].Algorithm = a
		if a.IsBucket() && i%2 == 1 {
			ls[i].Burst = ls[i].Rate + 3
		}
	}
	return ls
}

// testCarryMatchesAlgo changes a key's limit at random moments, each take
// naming the limits it had before (sluice.Take.Was), and checks every
// decision against algo's model, whose Carry converts the state at the
// change. A second key never changes limit: it must not be touched.
func testCarryMatchesAlgo(t *testing.T, newStore Factory) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			ls := carryLimits(a)
			clock, s, p := againstModel(t, newStore, ls[0])
			cur := ls[0]
			model := algo.NewState(p)
			steady := algo.NewState(p)
			rng := rand.New(rand.NewPCG(uint64(a), 61))
			carries := 0
			for i := range 400 {
				if rng.IntN(12) == 0 {
					cur = ls[rng.IntN(len(ls))]
				}
				switch rng.IntN(3) {
				case 0:
				case 1:
					advance(clock, time.Duration(rng.Int64N(int64(300*time.Millisecond))))
				default:
					advance(clock, time.Duration(rng.Int64N(int64(3*time.Millisecond))))
				}
				cost := int64(1)
				if rng.IntN(6) == 0 {
					cost = rng.Int64N(4)
				}
				var was []sluice.Limit
				for _, l := range ls {
					if l != cur {
						was = append(was, l)
					}
				}
				rng.Shuffle(len(was), func(i, j int) { was[i], was[j] = was[j], was[i] })
				// The store moves the key when it is next counted, so the
				// model converts then too.
				if np, err := algo.NewParams(cur); err != nil {
					t.Fatal(err)
				} else if np != model.P {
					model.Carry(np, clock.Now())
					carries++
				}
				d := call1(t, s, sluice.Take{Rule: "r", Key: "k", Limit: cur, Cost: cost, Was: was})
				var want algo.Result
				model.Take(clock.Now(), cost, &want)
				if !closeDecision(d, want, carries) {
					t.Fatalf("step %d under %v cost %d: store %s, algo %+v", i, cur, cost, Describe(d), want)
				}
				if rng.IntN(4) == 0 {
					d := call1(t, s, sluice.Take{Rule: "r", Key: "steady", Limit: ls[0], Cost: 1})
					steady.Take(clock.Now(), 1, &want)
					if !sameDecision(d, want) {
						t.Fatalf("step %d: a key whose limit never changed: store %s, algo %+v", i, Describe(d), want)
					}
				}
			}
		})
	}
}

// closeDecision is sameDecision for a key carried carries times: a store
// that counts in coarser units than nanoseconds keeps a carried state in
// whole units, rounded up, and a later carry scales that rounding (by up to
// 5 among carryLimits), so its waits may be longer than algo's by a few
// units per carry, never shorter; the rest is the same.
func closeDecision(d sluice.Decision, r algo.Result, carries int) bool {
	if sameDecision(d, r) {
		return true
	}
	if resolution == 1 {
		return false
	}
	slack := 10 * int64(resolution) * int64(carries)
	near := func(got time.Duration, want int64) bool {
		up := (want + int64(resolution) - 1) / int64(resolution) * int64(resolution)
		return int64(got) >= up && int64(got) <= up+slack
	}
	return d.Allowed == r.Allowed && d.Reason == r.Reason && d.Remaining == r.Remaining &&
		near(d.RetryAfter, r.RetryAfter) && near(d.ResetAfter, r.ResetAfter) && near(d.Delay, r.Delay)
}

// testCarryRaiseAndLower is the operator's case on every algorithm: a key
// used 3 of 3 in 10 minutes; raised to 6 it admits 3 more, lowered to 2
// none; handed back to 3 from 6 after 4 used, none. A take that names no
// earlier limit starts fresh, as before: the carry is the caller's to ask.
func testCarryRaiseAndLower(t *testing.T, newStore Factory) {
	per := func(a sluice.Algorithm, n int64) sluice.Limit {
		return sluice.Limit{Algorithm: a, Rate: n, Period: 10 * time.Minute}
	}
	burst := func(s sluice.Store, key string, l sluice.Limit, was ...sluice.Limit) int {
		n := 0
		for n < 200 && call1(t, s, sluice.Take{Rule: "r", Key: key, Limit: l, Cost: 1, Was: was}).Allowed {
			n++
		}
		return n
	}
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			s := newStore(t, sluice.NewManualClock(Epoch.Add(time.Minute)))
			three, six, two := per(a, 3), per(a, 6), per(a, 2)
			// The leaky queue admits one unit more than it queues (the one
			// leaving now): count from what a fresh key admits.
			fresh3, fresh6, fresh2 := burst(s, "f3", three), burst(s, "f6", six), burst(s, "f2", two)
			for _, c := range []struct {
				key  string
				to   sluice.Limit
				want int
			}{{"raised", six, fresh6 - fresh3}, {"lowered", two, max(0, fresh2-fresh3)}} {
				if n := burst(s, c.key, three); n != fresh3 {
					t.Fatalf("%s: a fresh key admitted %d under %v, another %d", c.key, n, three, fresh3)
				}
				if n := burst(s, c.key, c.to, three); n != c.want {
					t.Errorf("used %d under %v, then %v: %d more admitted, want %d", fresh3, three, c.to, n, c.want)
				}
			}
			// Raised, one more used, handed back: nothing more.
			burst(s, "back", three)
			if !call1(t, s, sluice.Take{Rule: "r", Key: "back", Limit: six, Cost: 1, Was: []sluice.Limit{three}}).Allowed {
				t.Fatal("raised to 6 after 3 used: the next take was refused")
			}
			if n := burst(s, "back", three, six); n != 0 {
				t.Errorf("4 used (3 under %v, 1 under %v), handed back: %d admitted, want 0", three, six, n)
			}
			// Without Was the new limit's key starts fresh (a new rule, or
			// a caller that keeps no history).
			burst(s, "nohistory", three)
			if n := burst(s, "nohistory", six); n != fresh6 {
				t.Errorf("a take naming no earlier limit admitted %d, want a fresh key's %d", n, fresh6)
			}
			// A limit of another algorithm is passed over.
			other := sluice.Algorithms()[(int(a)+1)%len(sluice.Algorithms())]
			burst(s, "otheralg", per(other, 3))
			if n := burst(s, "otheralg", three, per(other, 3)); n != fresh3 {
				t.Errorf("state of another algorithm carried: %d admitted, want a fresh key's %d", n, fresh3)
			}
		})
	}
}

// testCarryConcurrent raises a used key's limit while 64 goroutines take
// from it at one instant, each naming the old limit: the move happens once,
// and exactly the difference is admitted.
func testCarryConcurrent(t *testing.T, newStore Factory) {
	const goroutines, each = 64, 4
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			from := sluice.Limit{Algorithm: a, Rate: 50, Period: time.Hour}
			to := sluice.Limit{Algorithm: a, Rate: 120, Period: time.Hour}
			s := newStore(t, sluice.NewManualClock(Epoch))
			fresh := 0
			for fresh < 500 && take1(t, s, "r", "fresh", to, 1).Allowed {
				fresh++
			}
			used := 0
			for used < 500 && take1(t, s, "r", "hot", from, 1).Allowed {
				used++
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for range goroutines {
				wg.Go(func() {
					var out [1]sluice.Decision
					for range each {
						tk := []sluice.Take{{Rule: "r", Key: "hot", Limit: to, Cost: 1, Was: []sluice.Limit{from}}}
						if err := s.Take(context.Background(), tk, out[:]); err != nil {
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
			if want := int64(fresh - used); admitted.Load() != want {
				t.Fatalf("%d used under %v, raised to %v under %d concurrent takes: %d admitted, want %d", used, from, to, goroutines*each, admitted.Load(), want)
			}
		})
	}
}

// testCarryLeavesACopy: a take that has not seen the change (a request
// matched under the old limit a moment before, or a process whose
// overrides are behind) counts from what the key spent, never afresh; a
// change undone carries back from the new limit, not from the copy; a
// copy whose key has since gone idle under the new limit is no state.
func testCarryLeavesACopy(t *testing.T, newStore Factory) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(Epoch.Add(time.Minute))
			s := newStore(t, clock)
			three := sluice.Limit{Algorithm: a, Rate: 3, Period: 10 * time.Minute}
			six := sluice.Limit{Algorithm: a, Rate: 6, Period: 10 * time.Minute}
			burst := func(key string, l sluice.Limit, was ...sluice.Limit) int {
				n := 0
				for n < 20 && call1(t, s, sluice.Take{Rule: "r", Key: key, Limit: l, Cost: 1, Was: was}).Allowed {
					n++
				}
				return n
			}
			used := burst("k", three)
			if n := burst("k", six, three); n != burst("fresh6", six)-used {
				t.Fatalf("%d used, raised to 6: %d admitted", used, n)
			}
			if n := burst("k", three); n != 0 {
				t.Fatalf("a take that has not seen the raise admitted %d afresh, want 0", n)
			}
			// One that has not seen it but knows an older limit, which does
			// not hold the key: the copy is still all it knows.
			two := sluice.Limit{Algorithm: a, Rate: 2, Period: 10 * time.Minute}
			if n := burst("k", three, two); n != 0 {
				t.Fatalf("a take behind the raise, naming an older limit, admitted %d afresh, want 0", n)
			}
			if n := burst("k", three, six); n != 0 {
				t.Fatalf("all spent under 6, back to 3: %d admitted, want 0", n)
			}
			if n := burst("k", six, three); n != 0 {
				t.Fatalf("all spent, back to 3, raised to 6 again: %d admitted, want 0", n)
			}
			// Long after, the key idle under 6: the copy left under 3 is
			// not its state; the key is fresh.
			advance(clock, time.Hour)
			if n := burst("k", three, six); n != burst("fresh3", three) {
				t.Fatalf("the key idle an hour, back to 3: %d admitted, want a fresh key's", n)
			}
		})
	}
}

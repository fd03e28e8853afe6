package algo

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// Charges interleaved with takes on random traffic: every algorithm must
// agree with its reference model, debt included, on every answer.
func TestChargesMatchReferenceOnRandomTraffic(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			for seed := range uint64(300) {
				rng := rand.New(rand.NewPCG(seed, 77+uint64(a)))
				l := randomLimit(rng, a)
				p, err := NewParams(l)
				if err != nil {
					t.Fatal(err)
				}
				ref, got := newReference(p).(chargeModel), newFast(p)
				now := int64(1_700_000_000_000_000_000) + rng.Int64N(int64(time.Hour))
				for i := range 300 {
					now += randomGap(rng, &p)
					if rng.IntN(5) == 0 {
						units := 1 + rng.Int64N(3*p.Burst)
						ref.charge(now, units)
						got.charge(now, units)
						continue
					}
					cost := randomCost(rng, &p)
					want, have := ref.take(now, cost), got.take(now, cost)
					if want != have {
						t.Fatalf("seed %d limit %v step %d take(now=%d, cost=%d):\n got  %+v\n want %+v", seed, l, i, now, cost, have, want)
					}
				}
			}
		})
	}
}

// A charge beyond what is left puts the key into debt: the next take waits
// until the debt and its own cost are paid off at the rate.
func TestChargeBeyondTheLimitIsADebtPaidOffAtTheRate(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyMeter, sluice.LeakyQueue} {
		p := mustParams(t, sluice.Limit{Rate: 10, Period: time.Second, Burst: 10, Algorithm: a})
		s := NewState(p)
		const now = int64(1e18)
		s.Charge(now, 25) // 10 available: 15 owed, 1.5 s at 10/s
		var r Result
		s.Take(now, 1, &r)
		if r.Allowed || r.Remaining != 0 {
			t.Fatalf("%v: take after the debt: %+v, want limited with 0 remaining", a, r)
		}
		if want := int64(1600 * time.Millisecond); r.RetryAfter != want && a != sluice.LeakyQueue {
			t.Errorf("%v: RetryAfter = %v, want %v (15 owed + 1)", a, time.Duration(r.RetryAfter), time.Duration(want))
		}
		s.Take(now+int64(1600*time.Millisecond), 1, &r)
		if !r.Allowed {
			t.Errorf("%v: after the debt is paid off: %+v, want allowed", a, r)
		}
	}
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog} {
		p := mustParams(t, sluice.Limit{Rate: 10, Period: time.Minute, Algorithm: a})
		s := NewState(p)
		const now = int64(1e18) - int64(1e18)%int64(time.Minute) // a window's start
		s.Charge(now, 25)
		var r Result
		if s.Take(now+int64(time.Second), 1, &r); r.Allowed || r.Remaining != 0 {
			t.Fatalf("%v: take after the debt: %+v, want limited", a, r)
		}
	}
}

func TestChargeSaturatesInsteadOfOverflowing(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Rate: 3, Period: time.Hour, Algorithm: a}
		if a.IsBucket() {
			l.Burst = 3
		}
		s := NewState(mustParams(t, l))
		s.Charge(1<<62, 1<<62)
		s.Charge(1<<62, 1<<62)
		var r Result
		if s.Take(1<<62+1, 1, &r); r.Allowed || r.RetryAfter < 0 || r.ResetAfter < 0 || r.Remaining != 0 {
			t.Errorf("%v: after huge charges: %+v, want limited with non-negative times", a, r)
		}
	}
}

// A take of 0 units asks whether the key is over its limit: allowed at the
// limit exactly (nothing left, nothing owed), refused once a charge has put
// the key into debt, until the instant the debt is paid off. A sliding log
// never holds more than its limit, so it is never over.
func TestAZeroCostTakeIsRefusedOnlyInDebt(t *testing.T) {
	const second = int64(time.Second)
	overFor := map[sluice.Algorithm]int64{
		sluice.GCRA: second / 10, sluice.TokenBucket: second / 10, sluice.LeakyMeter: second / 10,
		sluice.LeakyQueue:  second / 10,
		sluice.FixedWindow: second, // the window's end
		// 11 counted of 10: in the next window, until 11 * (W - e) <= 10 * W.
		sluice.SlidingWindow: second + (second - 10*second/11),
	}
	for _, a := range sluice.Algorithms() {
		p, err := NewParams(sluice.Limit{Rate: 10, Period: time.Second, Algorithm: a})
		if err != nil {
			t.Fatal(err)
		}
		s := State{P: p}
		now := int64(1_700_000_000) * second // a window's start
		var r Result
		for s.Take(now, 1, &r); r.Allowed; s.Take(now, 1, &r) {
		} // to the limit: 10, or 11 for the leaky queue, whose first unit leaves at once
		if s.Take(now, 0, &r); !r.Allowed || r.Remaining != 0 || r.RetryAfter != 0 {
			t.Errorf("%v: a 0-unit take at the limit: %+v, want allowed with 0 left", a, r)
		}
		s.Charge(now, 1)
		s.Take(now, 0, &r)
		if a == sluice.SlidingLog {
			if !r.Allowed {
				t.Errorf("%v: a 0-unit take after a charge: %+v, want allowed (a log holds at most its limit)", a, r)
			}
			continue
		}
		if r.Allowed || r.Reason != sluice.ReasonLimited || r.Remaining != 0 || r.RetryAfter != overFor[a] {
			t.Errorf("%v: a 0-unit take one unit in debt: %+v, want limited for %d ns", a, r, overFor[a])
			continue
		}
		if s.Take(now+r.RetryAfter-1, 0, &r); r.Allowed {
			t.Errorf("%v: a 0-unit take 1 ns before the debt is paid off: %+v, want limited", a, r)
		}
		if s.Take(now+overFor[a], 0, &r); !r.Allowed {
			t.Errorf("%v: a 0-unit take when the debt is paid off: %+v, want allowed", a, r)
		}
	}
}

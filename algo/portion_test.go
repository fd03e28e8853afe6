package algo

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// A region that holds the whole limit for good decides as the token bucket
// it is a part of, take for take, on random traffic (refunds and peeks
// included).
func TestAWholePortionIsTheTokenBucket(t *testing.T) {
	for _, l := range []sluice.Limit{
		{Rate: 5, Period: time.Second, Burst: 10, Algorithm: sluice.TokenBucket},
		{Rate: 100, Period: time.Minute, Algorithm: sluice.TokenBucket},
		{Rate: 3, Period: time.Hour, Burst: 1, Algorithm: sluice.TokenBucket},
	} {
		p, err := NewParams(l)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		now := int64(1_000_000_000)
		tb := p.NewTokenBucket(now)
		part := NewPortion(&p, Whole, now)
		for i := range 20_000 {
			now += int64(rng.ExpFloat64() * float64(p.T) / 2)
			cost := int64(rng.IntN(4))
			if rng.IntN(20) == 0 {
				cost = -int64(rng.IntN(3) + 1)
			}
			var a, b Result
			if cost < 0 {
				tb = tb.refill(&p, now)
				tb.Tokens = min(tb.Tokens-cost*p.T, p.D)
				a = allowed(tb.Tokens/p.T, p.D-tb.Tokens)
				a.Applied()
			} else {
				tb = tb.Take(&p, now, cost, &a)
			}
			part = part.Take(&p, now, cost, &b)
			if a.Allowed != b.Allowed || a.Remaining != b.Remaining || a.Reason != b.Reason || (!a.Allowed && a.RetryAfter != b.RetryAfter) {
				t.Fatalf("%v take %d (cost %d at %d): bucket %+v, whole portion %+v", l, i, cost, now, a, b)
			}
		}
	}
}

// Regions whose shares move by lending, granting and leases that end (the
// shares held adding up to at most Whole at every instant) admit together
// no more than the one bucket allows over any interval: b + t/T units in
// any interval of length t. Checked on random traffic, moves and lease
// ends.
func TestPortionsTogetherStayWithinTheBucketsBound(t *testing.T) {
	p, err := NewParams(sluice.Limit{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.TokenBucket})
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 99))
		const regions = 3
		now := int64(0)
		owns := []int64{400, 300, 300}
		if seed%3 == 0 {
			owns = []int64{200, 100, 0} // room held back: grants only
		}
		var parts [regions]Portion
		for i := range parts {
			parts[i] = NewPortion(&p, owns[i], now)
		}
		var admitted []int64 // the time of each unit admitted
		for range 600 {
			now += int64(rng.ExpFloat64() * float64(p.T))
			i := rng.IntN(regions)
			switch rng.IntN(10) {
			case 0: // lend: the region gives part of its share up
				parts[i] = parts[i].Set(&p, now, rng.Int64N(parts[i].Share(now)+1), 0)
			case 1: // a grant from what no region holds, as a lease
				held := int64(0)
				for j := range parts {
					held += parts[j].Share(now) // what each holds, and may until its lease ends
				}
				if free := Whole - held; free > 0 {
					g := parts[i].Share(now) + rng.Int64N(free+1)
					parts[i] = parts[i].Set(&p, now, g, now+rng.Int64N(3*int64(time.Second)))
				}
			default:
				var r Result
				cost := int64(1 + rng.IntN(3))
				parts[i] = parts[i].Take(&p, now, cost, &r)
				if r.Allowed {
					for range cost {
						admitted = append(admitted, now)
					}
				}
			}
		}
		for a := range admitted {
			for b := a; b < len(admitted); b++ {
				if n := int64(b - a + 1); n > p.Burst+(admitted[b]-admitted[a])/p.T {
					t.Fatalf("seed %d: %d units admitted in %v, more than the bucket's %d", seed, n, time.Duration(admitted[b]-admitted[a]), p.Burst+(admitted[b]-admitted[a])/p.T)
				}
			}
		}
		if len(admitted) < 50 {
			t.Fatalf("seed %d: %d units admitted: the test checks too little", seed, len(admitted))
		}
	}
}

// A share that grows brings capacity, not tokens; one that shrinks drops
// what is above it; a lease ends on its own at its instant.
func TestAShareChangeNeverMakesTokens(t *testing.T) {
	p, _ := NewParams(sluice.Limit{Rate: 10, Period: time.Second, Burst: 10, Algorithm: sluice.TokenBucket})
	var r Result
	s := NewPortion(&p, 500, 0) // 5 of 10, full
	s = s.Take(&p, 0, 5, &r)
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("half of a bucket of 10: %+v", r)
	}
	s = s.Set(&p, 0, Whole, int64(time.Second)) // all of it, for a second, empty
	if s = s.Take(&p, 0, 1, &r); r.Allowed {
		t.Fatal("a grown share made a token")
	}
	s = s.Take(&p, int64(500*time.Millisecond), 5, &r) // 0.5 s at 10/s
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("half a second at the whole rate: %+v, want 5 admitted", r)
	}
	// The lease ends at 1 s: from then on half the rate, half the capacity.
	s = s.Take(&p, int64(2*time.Second), 0, &r)
	if r.Remaining != 5 || s.Held != 500 || s.Until != 0 {
		t.Fatalf("after the lease: %+v, part %+v; want 5 left at the own share", r, s)
	}
	// A lease that ends between two takes refills at its share until its
	// end only: 10 per 10 s, half of it owned, all of it leased empty for
	// 2 s: 2 tokens, then 4 s at half the rate, 2 more.
	slow, _ := NewParams(sluice.Limit{Rate: 10, Period: 10 * time.Second, Burst: 10, Algorithm: sluice.TokenBucket})
	q := NewPortion(&slow, 500, 0).Take(&slow, 0, 5, &r).Set(&slow, 0, Whole, int64(2*time.Second))
	if q.Take(&slow, int64(6*time.Second), 0, &r); r.Remaining != 4 {
		t.Fatalf("6 s after a lease of 2 s on an empty part: %d left, want 4", r.Remaining)
	}
	s = s.Set(&p, int64(2*time.Second), 100, 0) // lent down to 1 of 10
	if s = s.Take(&p, int64(2*time.Second), 2, &r); r.Allowed || r.Remaining != 1 {
		t.Fatalf("a shrunk share kept its tokens: %+v", r)
	}
}

package algo

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// Dense traffic on tiny limits: windows of a few nanoseconds and buckets of
// a few units, so that every boundary (a window's last nanosecond, a bucket
// exactly full or empty, a log entry exactly one window old, a sliding count
// at exactly its limit) is hit thousands of times. Each decision must equal
// the reference model's.
func TestDenseTrafficOnTinyLimitsMatchesTheReference(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		for burst := int64(1); burst <= 5; burst++ {
			for _, period := range []time.Duration{3, 8, 12} {
				l := sluice.Limit{Rate: burst, Period: period, Algorithm: a}
				if a.IsBucket() {
					l.Rate = 1 + burst/2
					l.Burst = burst
				}
				if int64(l.Period) < l.Rate {
					continue // more than one unit per nanosecond: not a valid limit
				}
				p, err := NewParams(l)
				if err != nil {
					t.Fatal(err)
				}
				ref, got := newReference(p), newFast(p)
				rng := rand.New(rand.NewPCG(uint64(a), uint64(burst)*100+uint64(period)))
				now := int64(1_000_000) + rng.Int64N(100)
				for i := range 1200 {
					now += rng.Int64N(4) // often the same instant, never far
					cost := rng.Int64N(burst + 2)
					if want, have := ref.take(now, cost), got.take(now, cost); want != have {
						t.Fatalf("%v step %d take(%d, %d): got %+v, want %+v", l, i, now, cost, have, want)
					}
				}
			}
		}
	}
}

// The integer helpers against math/big on random and edge operands.
func TestIntegerHelpers(t *testing.T) {
	edges := []int64{math.MinInt64, math.MinInt64 + 1, -1 << 40, -7, -4, -3, -2, -1, 0, 1, 2, 3, 4, 7, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}
	rng := rand.New(rand.NewPCG(7, 7))
	vals := append([]int64{}, edges...)
	for range 40 {
		vals = append(vals, rng.Int64()-rng.Int64()/2, rng.Int64N(100)-50)
	}
	clamp := func(x *big.Int) int64 {
		if x.Cmp(big.NewInt(math.MaxInt64)) > 0 {
			return math.MaxInt64
		}
		if x.Cmp(big.NewInt(math.MinInt64)) < 0 {
			return math.MinInt64
		}
		return x.Int64()
	}
	for _, a := range vals {
		for _, b := range vals {
			A, B := big.NewInt(a), big.NewInt(b)
			if got, want := AddSat(a, b), clamp(new(big.Int).Add(A, B)); got != want {
				t.Fatalf("AddSat(%d, %d) = %d, want %d", a, b, got, want)
			}
			if got, want := SubSat(a, b), clamp(new(big.Int).Sub(A, B)); got != want {
				t.Fatalf("SubSat(%d, %d) = %d, want %d", a, b, got, want)
			}
			if b > 0 {
				q, m := new(big.Int).DivMod(A, B, new(big.Int)) // Euclidean: m >= 0, so q is the floor
				if got := floorDiv(a, b); got != q.Int64() {
					t.Fatalf("floorDiv(%d, %d) = %d, want %d", a, b, got, q.Int64())
				}
				if got, want := windowStart(a, b), clamp(new(big.Int).Sub(A, m)); got != want {
					t.Fatalf("windowStart(%d, %d) = %d, want %d", a, b, got, want)
				}
				if a >= 0 {
					c := new(big.Int).Add(A, new(big.Int).Sub(B, big.NewInt(1)))
					c.Quo(c, B)
					if got := ceilDiv(a, b); got != c.Int64() {
						t.Fatalf("ceilDiv(%d, %d) = %d, want %d", a, b, got, c.Int64())
					}
				}
			}
		}
	}
	// 128-bit arithmetic on products of non-negative int64s.
	u := func(x u128) *big.Int {
		v := new(big.Int).SetUint64(x.hi)
		return v.Lsh(v, 64).Or(v, new(big.Int).SetUint64(x.lo))
	}
	var pos []int64
	for _, v := range vals {
		if v >= 0 {
			pos = append(pos, v)
		}
	}
	for i, a := range pos {
		for j, b := range pos {
			x := mul(a, b)
			if u(x).Cmp(new(big.Int).Mul(big.NewInt(a), big.NewInt(b))) != 0 {
				t.Fatalf("mul(%d, %d) = %v", a, b, u(x))
			}
			y := mul(pos[(i+1)%len(pos)], pos[(j+3)%len(pos)])
			if got, want := u(x.add(y)), new(big.Int).Add(u(x), u(y)); got.Cmp(want) != 0 {
				t.Fatalf("add: %v, want %v", got, want)
			}
			if got, want := x.less(y), u(x).Cmp(u(y)) < 0; got != want {
				t.Fatalf("less(%v, %v) = %v", u(x), u(y), got)
			}
			if u(x).Cmp(u(y)) >= 0 {
				if got, want := u(x.sub(y)), new(big.Int).Sub(u(x), u(y)); got.Cmp(want) != 0 {
					t.Fatalf("sub: %v, want %v", got, want)
				}
			}
			if x.isZero() != (u(x).Sign() == 0) {
				t.Fatalf("isZero(%v)", u(x))
			}
			for _, d := range []int64{1, 2, 3, max(b/2, 1), math.MaxInt64} {
				for _, limit := range []int64{0, 5, math.MaxInt64} {
					q := new(big.Int).Quo(u(x), big.NewInt(d))
					want := limit
					if q.Cmp(big.NewInt(limit)) < 0 {
						want = q.Int64()
					}
					if got := x.divCapped(d, limit); got != want {
						t.Fatalf("divCapped(%v, %d, %d) = %d, want %d", u(x), d, limit, got, want)
					}
				}
			}
		}
	}
	// A 128-bit value whose high word equals the divisor: the quotient needs
	// more than 64 bits.
	if got := (u128{hi: 5, lo: 0}).divCapped(5, 77); got != 77 {
		t.Fatalf("divCapped with hi == d: %d", got)
	}
}

// The same with a clock that steps back now and then, for the algorithms
// whose reference models step back the same way: an earlier now counts as
// no elapsed time. (GCRA and the leaky queue keep only a future instant, so
// an earlier now makes a key look emptier; the windows and the log keep
// what they forgot at the later time. Those answers are stricter or equal,
// and TestTimeGoingBackwardsCountsAsNoElapsedTime covers them.)
func TestDenseTrafficWithAClockThatStepsBack(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyMeter} {
		for burst := int64(1); burst <= 9; burst += 4 {
			l := sluice.Limit{Rate: burst, Period: 12, Algorithm: a}
			if a.IsBucket() {
				l.Rate = 1 + burst/2
				l.Burst = burst
			}
			p, err := NewParams(l)
			if err != nil {
				t.Fatal(err)
			}
			ref, got := newReference(p), newFast(p)
			rng := rand.New(rand.NewPCG(uint64(a)+99, uint64(burst)))
			now := int64(1_000_000)
			for i := range 3000 {
				now += rng.Int64N(7) - 2 // back by up to 2 ns, now and then
				cost := rng.Int64N(burst + 2)
				if want, have := ref.take(now, cost), got.take(now, cost); want != have {
					t.Fatalf("%v step %d take(%d, %d): got %+v, want %+v", l, i, now, cost, have, want)
				}
			}
		}
	}
}

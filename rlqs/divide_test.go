package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestDivideNeverExceedsTheTotalAndIsMaxMinFair(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 5000 {
		n := 1 + rng.IntN(8)
		total := rng.Float64() * 100
		claims := make([]float64, n)
		for i := range claims {
			claims[i] = rng.Float64() * 60
		}
		shares := divide(total, claims)
		sum, wanted := 0.0, 0.0
		for i, s := range shares {
			sum += s
			wanted += claims[i]
			if s < 0 {
				t.Fatalf("run %d: negative share %v", run, shares)
			}
		}
		if sum > total+1e-9 {
			t.Fatalf("run %d: shares %v sum %v above %v", run, shares, sum, total)
		}
		if math.Abs(sum-min(total, wanted)) > 1e-9 {
			t.Fatalf("run %d: shares %v sum %v, want %v (the claims or the total)", run, shares, sum, min(total, wanted))
		}
		// Max-min: no share beyond its claim, and a claim short of what
		// it asked gets at least every other share.
		for i := range shares {
			if shares[i] > claims[i]+1e-9 {
				t.Fatalf("run %d: claim %d got %v beyond its %v", run, i, shares[i], claims[i])
			}
			if shares[i] < claims[i]-1e-9 {
				for j := range shares {
					if shares[j] > shares[i]+1e-9 {
						t.Fatalf("run %d: claim %d got %v of %v while %d got more, %v", run, i, shares[i], claims[i], j, shares[j])
					}
				}
			}
		}
	}
}

func TestDivideGivesTheBusyWhatTheIdleLeave(t *testing.T) {
	got := divide(10, []float64{0.5, 20, 0.5, 0.5})
	if math.Abs(got[1]-8.5) > 1e-9 {
		t.Fatalf("the busy claim got %v of 10 beside three of 0.5, want 8.5", got)
	}
	got = divide(10, []float64{0.5, 3, 0.5})
	if got[1] != 3 || got[0] != 0.5 {
		t.Fatalf("claims under the total: %v, want each its claim", got)
	}
	got = divide(10, []float64{20, 20, 20, 20})
	for _, s := range got {
		if math.Abs(s-2.5) > 1e-9 {
			t.Fatalf("four busy claims: %v, want 2.5 each", got)
		}
	}
}

package sim

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/global"
)

// randomRegions draws a run: 2 to 5 regions with their own shares, one
// way to the home store 0-150 ms (a round trip of at most 300 ms) with
// jitter, clocks up to 10 s apart, a limit, demand that moves from region
// to region at random instants (twice the limit's rate, so that a region
// that has the share can use it all), a cut of one region, and borrowing
// in some runs.
func randomRegions(seed uint32) (RegionsConfig, []move) {
	rng := NewMulberry32(seed)
	pick := func(n int) int { return int(rng.Float64() * float64(n)) }
	n := 2 + pick(4)
	c := RegionsConfig{Seed: seed, Duration: 60 * time.Second, Options: global.Options{Own: map[string]int64{}}}
	for i := range n {
		name := fmt.Sprint("r", i)
		c.Names = append(c.Names, name)
		c.Options.Own[name] = int64(algo.Whole / n)
		if seed%4 == 1 {
			c.Options.Own[name] = int64(pick(algo.Whole / n)) // own shares of any size that fit
		}
		c.OneWay = append(c.OneWay, time.Duration(pick(150))*time.Millisecond)
		c.Skew = append(c.Skew, time.Duration(pick(20_000)-10_000)*time.Millisecond)
	}
	c.Jitter = time.Duration(pick(20)) * time.Millisecond
	rate := int64(5 + pick(46))
	c.Limit = sluice.Limit{Rate: rate * 10, Period: 10 * time.Second, Burst: rate * (1 + int64(pick(20))), Algorithm: sluice.TokenBucket}
	if seed%5 == 2 {
		c.Options.Borrow = 20 // 2%
	}
	var moves []move
	at := time.Duration(0)
	for at < c.Duration {
		moves = append(moves, move{at: at, region: pick(n)})
		at += time.Duration(8+pick(15)) * time.Second
	}
	perSecond := float64(rate) * 2
	c.Demand = func(i int, t time.Duration) float64 {
		j := 0
		for k, m := range moves {
			if m.at <= t {
				j = k
			}
		}
		if moves[j].region == i {
			return perSecond
		}
		return 0
	}
	if seed%3 != 0 {
		from := time.Duration(5+pick(40)) * time.Second
		c.Cuts = []RegionCut{{Region: pick(n), From: from, To: from + time.Duration(2+pick(15))*time.Second}}
	}
	return c, moves
}

type move struct {
	at     time.Duration
	region int
}

// Thousands of seeded runs of regions sharing one limit: whatever the
// regions, latencies, clocks, cuts and demand, the admissions over every
// interval stay within the bound of one token bucket (b + t/T), or of one
// (1+b) times larger where borrowing is allowed; a region cut off admits
// no more than its own share once its lease ended; and after demand moves
// to a region its link reaches, it admits at least 95% of the limit's rate
// (of what regions cut off do not keep) from 2T + RTT on (3T + RTT from
// every region idle).
func TestRegionsStayWithinTheBoundAndFollowDemand(t *testing.T) {
	runs := 2000
	if raceBuild || testing.Short() {
		runs = 150
	}
	moved, checked := 0, 0
	for seed := range uint32(runs) {
		c, moves := randomRegions(seed)
		run, err := RunRegions(c)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := algo.NewParams(c.Limit)
		allowed := p
		if c.Options.Borrow > 0 {
			f := float64(algo.Whole+c.Options.Borrow) / algo.Whole
			allowed.Burst = int64(math.Floor(float64(p.Burst) * f))
			allowed.T = int64(math.Ceil(float64(p.T) / f))
		}
		if over := overBound(run.Admitted, &allowed); over > 0 {
			t.Fatalf("seed %d (%d regions, borrow %d): %d over the bound in some interval", seed, len(c.Names), c.Options.Borrow, over)
		}
		o := c.Options.WithDefaults()
		for _, k := range c.Cuts {
			// Once its lease has ended (the lease's time, and the tick it
			// may take to see it), the region holds at most its own share.
			from := k.From + o.LeaseFor + o.Period
			var during []time.Duration
			for _, a := range run.Admitted[k.Region] {
				if a >= from && a < k.To {
					during = append(during, a)
				}
			}
			own := o.Own[c.Names[k.Region]]
			part := p
			if own == 0 {
				if len(during) > 0 {
					t.Fatalf("seed %d: a cut-off region with no own share admitted %d", seed, len(during))
				}
				continue
			}
			part.Burst = p.Burst * own / algo.Whole
			part.T = p.T * algo.Whole / own
			if over := overBound([][]time.Duration{during}, &part); over > 1 { // a token's rounding at the edge
				t.Fatalf("seed %d: region %d cut off admitted %d over its own share's bound", seed, k.Region, over)
			}
		}
		// Demand moved to region j at m: from m + 2T + RTT on, j admits at
		// least 95% of the limit's rate, over the 5 s that follow (when its
		// link is whole, and the move lasts).
		rate := float64(c.Limit.Rate) / c.Limit.Period.Seconds()
		for i, m := range moves {
			j := m.region
			rtt := 2 * c.OneWay[j]
			from := m.at + 2*o.Period + rtt
			if m.at == 0 {
				// From every region idle at its own share (no move: the
				// others learn of the demand at their next exchange), one
				// period more.
				from += o.Period
			}
			to := from + 5*time.Second
			if i+1 < len(moves) && moves[i+1].at < to || to > c.Duration || cutBetween(c.Cuts, j, m.at-o.LeaseFor, to) || (i > 0 && cutBetween(c.Cuts, moves[i-1].region, m.at-o.LeaseFor-o.Period, to)) {
				continue
			}
			// A region cut off keeps its own share (it cannot lend it):
			// what the others can have is the rest.
			avail := float64(algo.Whole)
			for r := range c.Names {
				if r != j && cutBetween(c.Cuts, r, m.at-o.LeaseFor-o.Period, to) {
					avail -= float64(o.Own[c.Names[r]])
				}
			}
			avail /= algo.Whole
			n := 0
			for _, a := range run.Admitted[j] {
				if a >= from && a < to {
					n++
				}
			}
			moved++
			if want := 0.95*rate*avail*5 - 2; float64(n) < want {
				t.Fatalf("seed %d (%d regions): demand moved to region %d at %v; %d admitted in the 5 s from %v, want at least %.0f", seed, len(c.Names), j, m.at, n, from, want)
			}
		}
		checked++
	}
	if checked < runs || moved < runs/4 {
		t.Fatalf("%d runs checked, %d moves measured: the test checks too little", checked, moved)
	}
	t.Logf("%d runs; %d moves of demand measured", checked, moved)
}

func cutBetween(cuts []RegionCut, region int, from, to time.Duration) bool {
	return slices.ContainsFunc(cuts, func(k RegionCut) bool { return k.Region == region && k.From < to && k.To > from })
}

// The built-in scenario: never over, and the picture's numbers.
func TestTheRegionsScenarioIsNeverOver(t *testing.T) {
	run, err := RunRegions(RegionsScenario())
	if err != nil {
		t.Fatal(err)
	}
	if run.Over != 0 {
		t.Fatalf("over the bound by %d", run.Over)
	}
	for i, a := range run.Admitted {
		if len(a) == 0 {
			t.Fatalf("region %d admitted nothing", i)
		}
	}
}

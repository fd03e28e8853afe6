package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/store/memory"
)

// DistributedRow is one configuration of the distributed scenario.
type DistributedRow struct {
	Gateways         int     `json:"gateways"`
	Skew             string  `json:"skew"`
	LatencyMs        float64 `json:"storeLatencyMs"`
	Mode             string  `json:"mode"`
	Requests         int     `json:"requests"`
	Exact            int     `json:"exact"`
	Admitted         int     `json:"admitted"`
	OverPercent      float64 `json:"overPercent"`
	UnderPercent     float64 `json:"underPercent"`
	CallsPerDecision float64 `json:"storeCallsPerDecision"`
	Fairness         float64 `json:"jainFairness"`
	AddedLatencyMs   float64 `json:"addedLatencyMsPerDecision"`
}

// Distributed runs gateways x sync mode x balancer skew x store latency on
// the real share layer over one shared embedded store, on a simulated clock:
// 60 s of a hot key offered twice its limit of 100 per second (burst 100).
// For each configuration it reports what the fleet admitted against what
// one exact limiter admits of the same traffic, the store calls per
// decision, Jain's fairness index of the gateways' admission rates (1 is
// perfectly fair), and the latency the store calls add per decision.
func Distributed() (*Report, error) {
	var rows []DistributedRow
	rep := &Report{
		Title: "distributed: one hot key, 100/s (burst 100), offered 200/s for 60 s, over N gateways sharing one store",
		Columns: []string{"gateways", "skew", "latency", "mode", "exact", "admitted", "over %", "under %",
			"calls/decision", "fairness", "added ms/decision"},
		Chart: &Chart{Y: []string{"over %", "under %"}, YLabel: "% over or under the exact answer"},
	}
	modes := []sluice.SyncMode{sluice.SyncExact, sluice.SyncLease, sluice.SyncPeriodic, sluice.SyncSplit, sluice.SyncLocal, sluice.SyncAuto}
	for _, n := range []int{2, 5} {
		for _, skew := range []string{"even", "skewed"} {
			for _, lat := range []time.Duration{time.Millisecond, 5 * time.Millisecond} {
				for _, m := range modes {
					r, err := runDistributed(n, skew, lat, m)
					if err != nil {
						return nil, err
					}
					rows = append(rows, r)
					rep.Rows = append(rep.Rows, []string{
						strconv.Itoa(n), skew, lat.String(), r.Mode, strconv.Itoa(r.Exact), strconv.Itoa(r.Admitted),
						fmt.Sprintf("%.1f", r.OverPercent), fmt.Sprintf("%.1f", r.UnderPercent),
						fmt.Sprintf("%.3f", r.CallsPerDecision), fmt.Sprintf("%.3f", r.Fairness), fmt.Sprintf("%.3f", r.AddedLatencyMs),
					})
				}
			}
		}
	}
	rep.JSON = rows
	rep.Notes = []string{
		"skewed: the balancer sends half the traffic to gateway 1 and spreads the rest evenly.",
		"exact and lease never admit more than exact; split is exact only when traffic is even; local admits up to N times the limit.",
		"added ms/decision = store calls per decision x the store's latency: what each mode costs a request on average.",
	}
	return rep, nil
}

// runDistributed simulates one configuration.
func runDistributed(n int, skew string, latency time.Duration, mode sluice.SyncMode) (DistributedRow, error) {
	lim := sluice.Limit{Rate: 100, Period: time.Second, Burst: 100}
	clock := sluice.NewManualClock(base)
	central := memory.New(memory.WithClock(clock))
	reference := memory.New(memory.WithClock(clock)) // one exact limiter for the same traffic
	sh := sluice.Sharing{Mode: mode, Batch: 50, HotAbove: 50}
	var gws []*share.Store
	for range n {
		g := share.New(central, share.Options{
			Local:    memory.New(memory.WithClock(clock)),
			Sharing:  func(string) sluice.Sharing { return sh },
			Gateways: func() int { return n },
			Clock:    clock, ManualTick: true,
		})
		gws = append(gws, g)
	}
	defer func() {
		for _, g := range gws {
			g.Close()
		}
	}()
	ctx := context.Background()
	row := DistributedRow{Gateways: n, Skew: skew, LatencyMs: float64(latency) / float64(time.Millisecond), Mode: mode.String()}
	offered := make([]int, n)
	admitted := make([]int, n)
	const seconds, perSecond = 60, 200
	rng := rand.New(rand.NewPCG(uint64(n), uint64(len(skew))))
	var out [1]sluice.Decision
	take := []sluice.Take{{Rule: "r", Key: "hot", Limit: lim, Cost: 1}}
	for i := range seconds * perSecond {
		// Poisson arrivals at perSecond, each to a gateway at random.
		clock.Advance(time.Duration(rng.ExpFloat64() * float64(time.Second) / perSecond))
		g := rng.IntN(n)
		if skew == "skewed" && rng.IntN(2) == 0 {
			g = 0 // half the traffic to gateway 1, the rest spread evenly
		}
		offered[g]++
		if err := gws[g].Take(ctx, take, out[:]); err != nil {
			return row, err
		}
		if out[0].Allowed {
			admitted[g]++
			row.Admitted++
		}
		if err := reference.Take(ctx, take, out[:]); err != nil {
			return row, err
		}
		if out[0].Allowed {
			row.Exact++
		}
		if i%10 == 0 {
			for _, g := range gws {
				g.Tick(ctx)
			}
		}
		row.Requests++
	}
	var calls uint64
	for _, g := range gws {
		calls += g.Stats().RemoteCalls
	}
	if d := row.Admitted - row.Exact; d > 0 {
		row.OverPercent = 100 * float64(d) / float64(row.Exact)
	} else {
		row.UnderPercent = 100 * float64(-d) / float64(row.Exact)
	}
	row.CallsPerDecision = float64(calls) / float64(row.Requests)
	row.AddedLatencyMs = row.CallsPerDecision * row.LatencyMs
	// Jain's index of the admission rates, each gateway's admitted share of
	// what it was offered.
	var sum, sq float64
	for i := range n {
		x := float64(admitted[i]) / float64(max(offered[i], 1))
		sum += x
		sq += x * x
	}
	if sq > 0 {
		row.Fairness = sum * sum / (float64(n) * sq)
	}
	return row, nil
}

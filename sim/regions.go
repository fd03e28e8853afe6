package sim

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/global"
)

// RegionsConfig is one run of regions sharing one limit:
// each region decides on its own part (algo.Portion) and exchanges with the
// coordinator (global.Options.Exchange) through its agent's own decisions
// (global.Agent's Plan and Answer), over links with latency that may be
// cut, on clocks that need not agree. Nothing is modelled that the product
// does not run: the sim only carries the messages and the traffic.
type RegionsConfig struct {
	Seed     uint32
	Limit    sluice.Limit // a token bucket
	Options  global.Options
	Names    []string        // the regions; Options.Own gives their own shares
	OneWay   []time.Duration // each region's one-way latency to the home store
	Jitter   time.Duration   // added to each message, uniformly up to it
	Skew     []time.Duration // each region's clock, ahead of the home store's
	Duration time.Duration
	// Demand is what region i asks for at t, requests a second (Poisson).
	Demand func(i int, t time.Duration) float64
	Cuts   []RegionCut
}

// RegionCut cuts region Region off the home store from From to To: its
// messages and the answers to it are lost.
type RegionCut struct {
	Region   int
	From, To time.Duration
}

// RegionsRun is what a run admitted, by region, on one clock.
type RegionsRun struct {
	Admitted  [][]time.Duration // each region's admissions
	Asked     []int
	Exchanges int
	// Shares are each region's shares as they changed: at, thousandths.
	Shares [][][2]int64
	// Over is the most any interval's admissions exceeded the limit's
	// bound (b + t/T over an interval of length t): 0 when none did.
	Over int
}

type regionEvent struct {
	at     int64
	kind   int // 0 request, 1 tick, 2 at home, 3 answer, 4 give up waiting, 5 traffic's next look
	region int
	seq    int
	asks   []global.Ask
	sent   int64 // region µs
	grants []global.Grant
	wanted []string
}

func (e *regionEvent) due() int64 { return e.at }

// simRegion is a region: its part of the key, its counters, its agent.
type simRegion struct {
	part    algo.Portion
	asked   int64
	short   int64
	agent   *global.Agent
	waiting bool
	seq     int
	sent    int64
}

// RunRegions runs one configuration.
func RunRegions(c RegionsConfig) (*RegionsRun, error) {
	p, err := algo.NewParams(c.Limit)
	if err != nil {
		return nil, err
	}
	if c.Limit.Algorithm != sluice.TokenBucket && c.Limit.Algorithm != sluice.GCRA {
		return nil, fmt.Errorf("sim: regions share a token bucket, not %v", c.Limit.Algorithm)
	}
	o := c.Options.WithDefaults()
	rule := &global.Rule{ID: "r", Limit: c.Limit, Options: o}
	rng := NewMulberry32(c.Seed)
	n := len(c.Names)
	regions := make([]*simRegion, n)
	var q events[*regionEvent]
	push := func(e *regionEvent) { heap.Push(&q, e) }
	clock := func(i int, t int64) int64 { return t + int64(c.Skew[i]) } // region i's clock, ns
	for i, name := range c.Names {
		regions[i] = &simRegion{part: algo.NewPortion(&p, o.Own[name], clock(i, 0)), agent: &global.Agent{Region: name}}
		push(&regionEvent{at: int64(o.Tick()) * int64(i) / int64(n), kind: 1, region: i})
		push(&regionEvent{at: 0, kind: 5, region: i})
	}
	var alloc global.KeyAllocation
	cut := func(i int, t int64) bool {
		for _, k := range c.Cuts {
			if k.Region == i && t >= int64(k.From) && t < int64(k.To) {
				return true
			}
		}
		return false
	}
	delay := func(i int) int64 {
		return int64(c.OneWay[i]) + int64(rng.Float64()*float64(c.Jitter))
	}
	run := &RegionsRun{Admitted: make([][]time.Duration, n), Asked: make([]int, n), Shares: make([][][2]int64, n)}
	note := func(i int, at int64) {
		sh := regions[i].part.Share(clock(i, at))
		if l := run.Shares[i]; len(l) == 0 || l[len(l)-1][1] != sh {
			run.Shares[i] = append(run.Shares[i], [2]int64{at, sh})
		}
	}
	end := int64(c.Duration)
	for q.Len() > 0 {
		e := heap.Pop(&q).(*regionEvent)
		if e.at >= end {
			break
		}
		r := regions[e.region]
		now := clock(e.region, e.at)
		switch e.kind {
		case 0: // a request
			var res algo.Result
			r.asked++
			run.Asked[e.region]++
			r.part = r.part.Take(&p, now, 1, &res)
			if res.Allowed {
				run.Admitted[e.region] = append(run.Admitted[e.region], time.Duration(e.at))
			} else {
				r.short++
			}
			push(&regionEvent{at: e.at + next(rng, c.Demand(e.region, time.Duration(e.at))), kind: 5, region: e.region})
		case 5: // the next request, if the region asks for any now
			if c.Demand(e.region, time.Duration(e.at)) > 0 {
				push(&regionEvent{at: e.at, kind: 0, region: e.region})
			} else {
				push(&regionEvent{at: e.at + int64(100*time.Millisecond), kind: 5, region: e.region})
			}
		case 1: // the agent's tick
			push(&regionEvent{at: e.at + int64(o.Tick()), kind: 1, region: e.region})
			if r.waiting {
				continue
			}
			part := global.Part{Key: "k", Held: r.part.Held, Own: r.part.Own, Asked: r.asked, Short: r.short}
			if r.part.Until != 0 {
				part.Until = r.part.Until / 1000
			}
			asks, release, due := r.agent.Plan(rule, &o, now/1000, []global.Part{part})
			if !due {
				continue
			}
			for _, s := range release {
				r.part = r.part.Set(&p, now, s.Share, s.Until*1000)
			}
			note(e.region, e.at)
			r.waiting, r.seq, r.sent = true, r.seq+1, now/1000
			run.Exchanges++
			if !cut(e.region, e.at) {
				push(&regionEvent{at: e.at + delay(e.region), kind: 2, region: e.region, seq: r.seq, asks: asks, sent: r.sent})
			}
			push(&regionEvent{at: e.at + int64(o.Period), kind: 4, region: e.region, seq: r.seq})
		case 2: // the request at the home store
			home := e.at // the home store's clock
			grants := make([]global.Grant, len(e.asks))
			for j, a := range e.asks {
				grants[j] = o.Exchange(&alloc, c.Names[e.region], a, home)
			}
			var wanted []string // the key, when others want it and the region did not ask
			if len(e.asks) == 0 && o.Wanted(&alloc, c.Names[e.region], home) {
				wanted = []string{"k"}
			}
			if !cut(e.region, e.at) {
				push(&regionEvent{at: e.at + delay(e.region), kind: 3, region: e.region, seq: e.seq, asks: e.asks, sent: e.sent, grants: grants, wanted: wanted})
			}
		case 3: // the answer
			if !r.waiting || e.seq != r.seq {
				continue // given up on: never applied
			}
			r.waiting = false
			for _, s := range r.agent.Answer(rule, &o, e.sent, e.asks, e.grants, e.wanted) {
				r.part = r.part.Set(&p, now, s.Share, s.Until*1000)
			}
			note(e.region, e.at)
		case 4: // no answer in time
			if r.waiting && e.seq == r.seq {
				r.waiting = false
			}
		}
	}
	run.Over = overBound(run.Admitted, &p)
	return run, nil
}

// next is the time to a Poisson arrival at rate a second.
func next(rng *Mulberry32, rate float64) int64 {
	if rate <= 0 {
		return int64(100 * time.Millisecond)
	}
	return int64(-math.Log(1-rng.Float64()) / rate * float64(time.Second))
}

// overBound is the most admissions over any interval exceed b + t/T, the
// bound of one token bucket: with g(k) = k - t_k/T over the admissions in
// time order, an interval from i to j holds j - i + 1 of them, so the
// excess is the largest g(j) - g(i) + 1 - b with j >= i.
func overBound(admitted [][]time.Duration, p *algo.Params) int {
	var all []time.Duration
	for _, a := range admitted {
		all = append(all, a...)
	}
	slices.Sort(all)
	worst := 0
	best := math.Inf(-1) // max over j >= i of g(j), scanning i down
	for i := len(all) - 1; i >= 0; i-- {
		g := float64(i) - float64(all[i])/float64(p.T)
		best = math.Max(best, g)
		if over := int(math.Floor(best-g+1+1e-9)) - int(p.Burst); over > worst {
			worst = over
		}
	}
	return worst
}

// Regions is the built-in scenario: three regions with 75 ms each way to the
// home store, one limit of 100 per 10 s; demand moves from eu to us at 20 s
// and to ap at 40 s; us is cut off from 30 s to 40 s.
func Regions() (*Report, error) {
	c := RegionsScenario()
	run, err := RunRegions(c)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Title:   "regions: one limit of 100 per 10 s (burst 100) over eu, us and ap, 75 ms each way to the home store; demand 30/s moves eu -> us at 20 s, us -> ap at 40 s; us cut off 30-40 s",
		Columns: append([]string{"second"}, append(append([]string{}, c.Names...), "limit", "asked")...),
		Chart:   &Chart{Lines: true, X: "second", Y: append(append([]string{}, c.Names...), "limit"), YLabel: "admitted per second"},
	}
	seconds := int(c.Duration / time.Second)
	for s := range seconds {
		row := []string{fmt.Sprint(s)}
		asked := 0
		for i := range c.Names {
			n := 0
			for _, t := range run.Admitted[i] {
				if int(t/time.Second) == s {
					n++
				}
			}
			row = append(row, fmt.Sprint(n))
			asked += int(math.Round(c.Demand(i, time.Duration(s)*time.Second)))
		}
		row = append(row, fmt.Sprint(c.Limit.Rate*int64(time.Second)/int64(c.Limit.Period)), fmt.Sprint(asked))
		rep.Rows = append(rep.Rows, row)
	}
	total := 0
	for _, a := range run.Admitted {
		total += len(a)
	}
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("admitted %d in %v; over the bound of one bucket (b + t/T over any interval t): %d; exchanges %d", total, c.Duration, run.Over, run.Exchanges),
		"each region decides on its own store; capacity follows demand within 2T + RTT (T the exchange period, 1 s); a cut-off region falls to its own share within the lease (3 s)")
	rep.JSON = struct {
		Admitted map[string]int `json:"admitted"`
		Over     int            `json:"over"`
	}{admittedByName(c.Names, run), run.Over}
	return rep, nil
}

func admittedByName(names []string, run *RegionsRun) map[string]int {
	m := map[string]int{}
	for i, n := range names {
		m[n] = len(run.Admitted[i])
	}
	return m
}

// RegionsScenario is the built-in scenario's configuration.
func RegionsScenario() RegionsConfig {
	names := []string{"eu", "us", "ap"}
	return RegionsConfig{
		Seed:     7,
		Limit:    sluice.Limit{Rate: 100, Period: 10 * time.Second, Algorithm: sluice.TokenBucket},
		Options:  global.Options{Own: map[string]int64{"eu": 333, "us": 333, "ap": 333}},
		Names:    names,
		OneWay:   []time.Duration{75 * time.Millisecond, 75 * time.Millisecond, 75 * time.Millisecond},
		Skew:     []time.Duration{0, 3 * time.Second, -2 * time.Second},
		Duration: 60 * time.Second,
		Demand: func(i int, t time.Duration) float64 {
			active := 0
			switch {
			case t >= 40*time.Second:
				active = 2
			case t >= 20*time.Second:
				active = 1
			}
			if i == active {
				return 30
			}
			return 0
		},
		Cuts: []RegionCut{{Region: 1, From: 30 * time.Second, To: 40 * time.Second}},
	}
}

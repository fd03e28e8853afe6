package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/store/memory"
)

// The overload scenario's backend: overC servers, each serving one request
// at a time in overBase, slowed by contention: a request that starts while
// n requests are in the backend (queued or served) takes
// overBase x (1 + overSlow x n / overC). Its capacity, the most it can
// finish per second, is reached with every server busy and nothing queued:
// overC / (overBase x (1 + overSlow)) = 400 a second; past it, the queue
// grows, every request slows, and an unprotected backend serves ever fewer
// in time. A request counts as goodput when it completes within
// overDeadline of its arrival (the client has given up after that).
//
// Requests come in three priority tiers, in a fixed mix: critical 20%,
// default 50%, sheddable 30%. A contender "with tiers" keeps 20% of its
// limit for critical and 50% more for default and critical (the floors of
// sluice's tiers: a tier may not take the shares kept for the tiers above).
const (
	overC        = 10
	overBase     = 20 * time.Millisecond
	overSlow     = 0.25
	overDeadline = time.Second
	overStep     = 20 * time.Second // each load level lasts this long
	// overWait is how long a concurrency limit's queue holds a request for
	// a permit (the limiter's Queue and QueueTimeout; by tier with tiers).
	overWait = 15 * time.Millisecond
)

var (
	overLoads     = []float64{0.5, 1, 1.5, 2, 2.5, 3} // x capacity
	overSlowLoads = []float64{1, 3}                   // x capacity, with the service time doubled
	overMix       = []float64{0.2, 0.5, 0.3}          // critical, default, sheddable
	overTiers     = []float64{0.1, 0.2}               // shares kept for critical, default
)

// OverloadRow is one contender at one load.
type OverloadRow struct {
	Contender string  `json:"contender"`
	Load      float64 `json:"load"`           // offered, x capacity
	Slow      bool    `json:"serviceDoubled"` // the backend's service time doubled
	Offered   float64 `json:"offeredPerSecond"`
	Goodput   float64 `json:"goodputPerSecond"` // completed within the deadline
	Shed      float64 `json:"shedPerSecond"`    // refused by the limiter
	P50Ms     float64 `json:"p50Ms"`            // latency of the admitted, queueing included
	P99Ms     float64 `json:"p99Ms"`
	// Success is, per tier (critical, default, sheddable), the share of its
	// requests done within the deadline, in percent.
	Success []float64 `json:"successPercent"`
}

// OverloadResult is the overload scenario's outcome.
type OverloadResult struct {
	CapacityPerSecond float64       `json:"capacityPerSecond"`
	DeadlineMs        int64         `json:"deadlineMs"`
	Rows              []OverloadRow `json:"rows"`
}

// overloadContender decides admissions of a tier's requests; done is told
// of each admitted request's end.
type overloadContender struct {
	name  string
	admit func(now time.Time, tier int) (done func(latency time.Duration, late bool), ok bool)
	// queue: a refused request waits up to overWait for a permit, the
	// highest tier first when tiers is set, else first come first served.
	queue, tiers bool
}

// Overload offers a backend (see the constants above) Poisson traffic from
// 0.5x to 3x its capacity, each level for overStep, then 1x and 3x with
// the service time doubled, through no limiter, a fixed rate (a token
// bucket at the capacity), a fixed concurrency limit (the servers), AIMD,
// Gradient2 and MinRTT, each also with tiers, and reports each one's goodput, what
// it shed, its latencies and each tier's success. Simulated time, real
// algorithms.
func Overload() (*Report, error) {
	capacity := float64(overC) / (overBase.Seconds() * (1 + overSlow))
	res := OverloadResult{CapacityPerSecond: capacity, DeadlineMs: overDeadline.Milliseconds()}
	type maker func(clock *sluice.ManualClock, tiers []float64) (overloadContender, error)
	makers := []struct {
		name string
		mk   maker
	}{
		{"no limiter", func(*sluice.ManualClock, []float64) (overloadContender, error) {
			return overloadContender{admit: func(time.Time, int) (func(time.Duration, bool), bool) { return nil, true }}, nil
		}},
		{"fixed rate", func(clock *sluice.ManualClock, tiers []float64) (overloadContender, error) {
			return rateContender(clock, capacity, tiers)
		}},
		{"fixed concurrency", func(clock *sluice.ManualClock, tiers []float64) (overloadContender, error) {
			return concurrencyContender(concurrency.Fixed{N: overC}, clock, tiers), nil
		}},
		{"AIMD", func(clock *sluice.ManualClock, tiers []float64) (overloadContender, error) {
			return concurrencyContender(concurrency.AIMD{Start: overC, Timeout: 4 * overBase}, clock, tiers), nil
		}},
		{"Gradient2", func(clock *sluice.ManualClock, tiers []float64) (overloadContender, error) {
			return concurrencyContender(concurrency.NewGradient2(concurrency.Gradient2{Start: overC}), clock, tiers), nil
		}},
		{"MinRTT", func(clock *sluice.ManualClock, tiers []float64) (overloadContender, error) {
			return concurrencyContender(concurrency.NewMinRTT(concurrency.MinRTT{Start: overC}), clock, tiers), nil
		}},
	}
	rep := &Report{
		Title: fmt.Sprintf("overload: %d servers of %v each, slowed by contention (capacity %.0f/s); offered 0.5x to 3x for %v each, then 1x and 3x with the service time doubled; goodput = done within %v; tiers: critical 20%%, default 50%%, sheddable 30%% of the requests",
			overC, overBase, capacity, overStep, overDeadline),
		Columns: []string{"contender", "load (x capacity)", "service", "offered/s", "goodput/s", "shed/s", "p50 (ms)", "p99 (ms)", "critical ok %", "default ok %", "sheddable ok %"},
		JSON:    &res,
		Chart:   &Chart{Y: []string{"goodput/s", "shed/s"}, YLabel: "requests per second"},
	}
	for _, m := range makers {
		for _, tiers := range [][]float64{nil, overTiers} {
			if tiers != nil && m.name == "no limiter" {
				continue // nothing to keep a share of
			}
			clock := sluice.NewManualClock(at(0))
			c, err := m.mk(clock, tiers)
			if err != nil {
				return nil, err
			}
			c.name = m.name
			if tiers != nil {
				c.name += " with tiers"
				c.tiers = true
			}
			for _, row := range runOverload(c, clock, capacity) {
				res.Rows = append(res.Rows, row)
				service := "normal"
				if row.Slow {
					service = "doubled"
				}
				cells := []string{row.Contender, strconv.FormatFloat(row.Load, 'f', 1, 64), service,
					strconv.FormatFloat(row.Offered, 'f', 0, 64), strconv.FormatFloat(row.Goodput, 'f', 0, 64), strconv.FormatFloat(row.Shed, 'f', 0, 64),
					latencyCell(row.P50Ms), latencyCell(row.P99Ms)}
				for _, x := range row.Success {
					cells = append(cells, strconv.FormatFloat(x, 'f', 1, 64))
				}
				rep.Rows = append(rep.Rows, cells)
			}
		}
	}
	rep.Notes = append(rep.Notes,
		"Past its capacity the unprotected backend's queue grows, contention slows every request, and goodput falls toward nothing; a limiter that bounds what is in flight keeps the backend near its capacity and sheds the rest at once.",
		"A fixed rate set at the capacity holds only while the service time does: when it doubles, the rate admits twice what the backend can finish, and goodput collapses; a concurrency limit follows the backend down.",
		"With tiers, what is shed is shed from the lowest tier up: critical requests keep their success while sheddable ones absorb the overload.")
	return rep, nil
}

// latencyCell writes a latency in milliseconds; beyond a minute, only that
// (a backlog drained at the end of the run can take hours).
func latencyCell(ms float64) string {
	if ms > 60000 {
		return ">60000"
	}
	return strconv.FormatFloat(ms, 'f', 0, 64)
}

// rateContender is a token bucket at the capacity (a burst of the servers'
// count), with tiers as floors: sluice's tiers on one key.
func rateContender(clock *sluice.ManualClock, capacity float64, tiers []float64) (overloadContender, error) {
	store := memory.New(memory.WithClock(clock))
	l := sluice.Limit{Rate: int64(capacity), Period: time.Second, Burst: overC, Algorithm: sluice.TokenBucket}
	if err := l.Validate(); err != nil {
		return overloadContender{}, err
	}
	takes := make([]sluice.Take, 1)
	out := make([]sluice.Decision, 1)
	return overloadContender{admit: func(_ time.Time, tier int) (func(time.Duration, bool), bool) {
		takes[0] = sluice.Take{Rule: "r", Key: "backend", Limit: l, Cost: 1}
		if tiers != nil {
			share := 0.0
			for i := 0; i < tier && i < len(tiers); i++ {
				share += tiers[i]
			}
			takes[0].Floor = int64(share * float64(l.Burst))
		}
		if store.Take(context.Background(), takes, out) != nil {
			return nil, false
		}
		return nil, out[0].Allowed
	}}, nil
}

func concurrencyContender(alg concurrency.Algorithm, clock *sluice.ManualClock, tiers []float64) overloadContender {
	l := concurrency.New(alg, concurrency.Options{Min: 2, Max: 10 * overC, Tiers: tiers, Now: func() time.Time { return time.Unix(0, clock.Now()) }})
	return overloadContender{queue: true, admit: func(_ time.Time, tier int) (func(time.Duration, bool), bool) {
		p, err := l.AcquireAt(context.Background(), tier)
		if err != nil {
			return nil, false
		}
		return func(_ time.Duration, late bool) {
			if late {
				p.Release(concurrency.Dropped)
			} else {
				p.Release(concurrency.Success)
			}
		}, true
	}}
}

// An overload event is a request's completion.
type overEvent struct {
	at      time.Duration
	arrived time.Duration
	tier    int
	step    int // the load level it arrived in
	done    func(time.Duration, bool)
}

func (e overEvent) due() int64 { return int64(e.at) }

// overQueued is a request waiting: admitted and waiting for a server, or
// refused and waiting for a permit (contenders with a queue).
type overQueued struct {
	arrived time.Duration
	tier    int
	step    int
	done    func(time.Duration, bool)
}

// overStats are one load level's counts. Each request counts in the step
// it arrived in, whenever it ends: the run drains every admitted request
// at its end.
type overStats struct {
	offered, good, shed   int
	tierOffered, tierGood [3]int
	lat                   []time.Duration
}

// overloadRun is one contender's run through the load levels: the
// requests being served (by completion time), those waiting, and each
// level's counts.
type overloadRun struct {
	c       overloadContender
	clock   *sluice.ManualClock
	base    time.Duration // a request's service time with nothing else in flight
	busy    events[overEvent]
	queue   []overQueued // admitted, waiting for a server
	waiting []overQueued // refused, waiting for a permit
	stats   []overStats
}

// finish ends a served request: its latency, whether it was in time, and
// the contender told.
func (o *overloadRun) finish(e overEvent) {
	lat := e.at - e.arrived
	late := lat > overDeadline
	st := &o.stats[e.step]
	if !late {
		st.good++
		st.tierGood[e.tier]++
	}
	st.lat = append(st.lat, lat)
	if e.done != nil {
		o.clock.Set(at(e.at.Seconds()))
		e.done(lat, late)
	}
}

// start serves q from t: contention slows every request as more are in
// the backend.
func (o *overloadRun) start(t time.Duration, q overQueued) {
	n := len(o.busy) + len(o.queue)
	service := time.Duration(float64(o.base) * (1 + overSlow*float64(n)/overC))
	heap.Push(&o.busy, overEvent{at: t + service, arrived: q.arrived, tier: q.tier, step: q.step, done: q.done})
}

// enter gives an admitted request a server, or a place in the queue.
func (o *overloadRun) enter(t time.Duration, q overQueued) {
	if len(o.busy) < overC {
		o.start(t, q)
	} else {
		o.queue = append(o.queue, q)
	}
}

// expire sheds the waiters that have waited overWait by t.
func (o *overloadRun) expire(t time.Duration) {
	kept := o.waiting[:0]
	for _, w := range o.waiting {
		if t-w.arrived > overWait {
			o.stats[w.step].shed++
			continue
		}
		kept = append(kept, w)
	}
	o.waiting = kept
}

// admitWaiting gives the permits free at t to waiters, the highest tier
// first with tiers, else the longest waiting.
func (o *overloadRun) admitWaiting(t time.Duration) {
	o.expire(t)
	for len(o.waiting) > 0 {
		best := 0
		for i, w := range o.waiting {
			if o.c.tiers && w.tier < o.waiting[best].tier {
				best = i
			}
		}
		w := o.waiting[best]
		o.clock.Set(at(t.Seconds()))
		done, ok := o.c.admit(time.Unix(0, o.clock.Now()), w.tier)
		if !ok {
			return
		}
		o.waiting = slices.Delete(o.waiting, best, best+1)
		w.done = done
		o.enter(t, w)
	}
}

// advance completes every request due by t, starting queued ones as
// servers free up and handing freed permits to waiters.
func (o *overloadRun) advance(t time.Duration) {
	for len(o.busy) > 0 && o.busy[0].at <= t {
		e := heap.Pop(&o.busy).(overEvent)
		o.finish(e)
		if len(o.queue) > 0 {
			q := o.queue[0]
			o.queue = o.queue[1:]
			o.start(e.at, q)
		}
		if len(o.waiting) > 0 {
			o.admitWaiting(e.at)
		}
	}
	o.expire(t)
}

// runOverload simulates one contender through every load level, then the
// slow ones: Poisson arrivals at each level's rate, each admitted or
// refused by the contender as it arrives.
func runOverload(c overloadContender, clock *sluice.ManualClock, capacity float64) []OverloadRow {
	rng := NewMulberry32(1011)
	levels := append(slices.Clone(overLoads), overSlowLoads...)
	o := &overloadRun{c: c, clock: clock, base: overBase, stats: make([]overStats, len(levels))}
	now := time.Duration(0)
	for i, load := range levels {
		if i >= len(overLoads) {
			o.base = 2 * overBase
		}
		rate := load * capacity
		end := now + overStep
		step := &o.stats[i]
		for {
			now += time.Duration(-math.Log(1-rng.Float64()) / rate * float64(time.Second))
			if now >= end {
				break
			}
			o.advance(now)
			clock.Set(at(now.Seconds()))
			tier, x := 0, rng.Float64()
			for tier < len(overMix)-1 && x >= overMix[tier] {
				x -= overMix[tier]
				tier++
			}
			step.offered++
			step.tierOffered[tier]++
			done, ok := c.admit(time.Unix(0, clock.Now()), tier)
			if !ok {
				if c.queue {
					o.waiting = append(o.waiting, overQueued{arrived: now, tier: tier, step: i})
				} else {
					step.shed++
				}
				continue
			}
			o.enter(now, overQueued{arrived: now, tier: tier, step: i, done: done})
		}
		now = end
		o.advance(now)
	}
	o.advance(math.MaxInt64) // drain: every admitted request ends
	var rows []OverloadRow
	for i, load := range levels {
		step := &o.stats[i]
		secs := overStep.Seconds()
		row := OverloadRow{Contender: c.name, Load: load, Slow: i >= len(overLoads), Offered: float64(step.offered) / secs, Goodput: float64(step.good) / secs, Shed: float64(step.shed) / secs}
		if len(step.lat) > 0 {
			slices.Sort(step.lat)
			row.P50Ms = float64(step.lat[len(step.lat)/2].Milliseconds())
			row.P99Ms = float64(step.lat[len(step.lat)*99/100].Milliseconds())
		}
		for t := range step.tierOffered {
			row.Success = append(row.Success, 100*float64(step.tierGood[t])/float64(max(step.tierOffered[t], 1)))
		}
		rows = append(rows, row)
	}
	return rows
}

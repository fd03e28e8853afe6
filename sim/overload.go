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
// overBase x (1 + overSlow x n / overC). So the backend serves overC /
// overBase = 500 requests a second when lightly loaded, and less the longer
// its queue: past its capacity an unprotected backend serves ever fewer in
// time. A request counts as goodput when it completes within overDeadline
// of its arrival (the client has given up after that).
const (
	overC        = 10
	overBase     = 20 * time.Millisecond
	overSlow     = 0.25
	overDeadline = time.Second
	overStep     = 20 * time.Second // each load level lasts this long
)

var overLoads = []float64{0.5, 1, 1.5, 2, 2.5, 3} // x capacity

// OverloadRow is one contender at one load.
type OverloadRow struct {
	Contender string  `json:"contender"`
	Load      float64 `json:"load"` // offered, x capacity
	Offered   float64 `json:"offeredPerSecond"`
	Goodput   float64 `json:"goodputPerSecond"` // completed within the deadline
	Shed      float64 `json:"shedPerSecond"`    // refused by the limiter
	P50Ms     float64 `json:"p50Ms"`            // latency of the admitted, queueing included
	P99Ms     float64 `json:"p99Ms"`
}

// OverloadResult is the overload scenario's outcome.
type OverloadResult struct {
	CapacityPerSecond float64       `json:"capacityPerSecond"`
	DeadlineMs        int64         `json:"deadlineMs"`
	Rows              []OverloadRow `json:"rows"`
}

// overloadContender decides admissions; done is told of each admitted
// request's end.
type overloadContender struct {
	name  string
	admit func(now time.Time) (done func(latency time.Duration, late bool), ok bool)
}

// Overload offers a backend (see the constants above) Poisson traffic from
// 0.5x to 3x its capacity, each level for overStep, through no limiter, a
// fixed rate (a token bucket at the capacity), a fixed concurrency limit
// (twice the servers), AIMD and Gradient2, and reports each one's goodput,
// what it shed and its latencies. Simulated time, real algorithms.
func Overload() (*Report, error) {
	capacity := float64(overC) / overBase.Seconds()
	res := OverloadResult{CapacityPerSecond: capacity, DeadlineMs: overDeadline.Milliseconds()}
	makers := []func(clock *sluice.ManualClock) (overloadContender, error){
		func(*sluice.ManualClock) (overloadContender, error) {
			return overloadContender{"no limiter", func(time.Time) (func(time.Duration, bool), bool) { return nil, true }}, nil
		},
		func(clock *sluice.ManualClock) (overloadContender, error) {
			lim, err := memory.New(memory.WithClock(clock)).Limiter("r", sluice.Limit{Rate: int64(capacity), Period: time.Second, Burst: overC * 2, Algorithm: sluice.TokenBucket})
			if err != nil {
				return overloadContender{}, err
			}
			return overloadContender{"fixed rate", func(time.Time) (func(time.Duration, bool), bool) { return nil, lim.Allow("backend") }}, nil
		},
		func(clock *sluice.ManualClock) (overloadContender, error) {
			return concurrencyContender("fixed concurrency", concurrency.Fixed{N: 2 * overC}, clock), nil
		},
		func(clock *sluice.ManualClock) (overloadContender, error) {
			return concurrencyContender("AIMD", concurrency.AIMD{Start: 2 * overC, Timeout: overDeadline / 2}, clock), nil
		},
		func(clock *sluice.ManualClock) (overloadContender, error) {
			return concurrencyContender("Gradient2", concurrency.NewGradient2(concurrency.Gradient2{Start: 2 * overC}), clock), nil
		},
	}
	rep := &Report{
		Title: fmt.Sprintf("overload: %d servers of %v each (capacity %.0f/s), slowed by contention; offered 0.5x to 3x for %v each; goodput = done within %v",
			overC, overBase, capacity, overStep, overDeadline),
		Columns: []string{"contender", "load (x capacity)", "offered/s", "goodput/s", "shed/s", "p50 (ms)", "p99 (ms)"},
		JSON:    &res,
		Chart:   &Chart{Y: []string{"goodput/s", "shed/s"}, YLabel: "requests per second"},
	}
	for _, mk := range makers {
		clock := sluice.NewManualClock(at(0))
		c, err := mk(clock)
		if err != nil {
			return nil, err
		}
		for _, row := range runOverload(c, clock, capacity) {
			res.Rows = append(res.Rows, row)
			rep.Rows = append(rep.Rows, []string{row.Contender, strconv.FormatFloat(row.Load, 'f', 1, 64),
				strconv.FormatFloat(row.Offered, 'f', 0, 64), strconv.FormatFloat(row.Goodput, 'f', 0, 64), strconv.FormatFloat(row.Shed, 'f', 0, 64),
				strconv.FormatFloat(row.P50Ms, 'f', 0, 64), strconv.FormatFloat(row.P99Ms, 'f', 0, 64)})
		}
	}
	rep.Notes = append(rep.Notes, "Past its capacity the unprotected backend's queue grows, contention slows every request, and goodput falls toward nothing; a limiter that bounds what is in flight keeps the backend near its capacity and sheds the rest at once.")
	return rep, nil
}

func concurrencyContender(name string, alg concurrency.Algorithm, clock *sluice.ManualClock) overloadContender {
	l := concurrency.New(alg, concurrency.Options{Min: 2, Max: 10 * overC, Now: func() time.Time { return time.Unix(0, clock.Now()) }})
	return overloadContender{name, func(time.Time) (func(time.Duration, bool), bool) {
		p, err := l.Acquire(context.Background())
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
	done    func(time.Duration, bool)
}

type overEvents []overEvent

func (h overEvents) Len() int           { return len(h) }
func (h overEvents) Less(i, j int) bool { return h[i].at < h[j].at }
func (h overEvents) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *overEvents) Push(x any)        { *h = append(*h, x.(overEvent)) }
func (h *overEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// runOverload simulates one contender through every load level.
func runOverload(c overloadContender, clock *sluice.ManualClock, capacity float64) []OverloadRow {
	rng := NewMulberry32(1011)
	var busy overEvents // requests being served, by completion time
	type queued struct {
		arrived time.Duration
		done    func(time.Duration, bool)
	}
	var queue []queued
	now := time.Duration(0)
	var rows []OverloadRow
	var step struct {
		offered, good, shed int
		lat                 []time.Duration
	}
	finish := func(e overEvent) {
		lat := e.at - e.arrived
		late := lat > overDeadline
		if !late {
			step.good++
		}
		step.lat = append(step.lat, lat)
		if e.done != nil {
			clock.Set(at(e.at.Seconds()))
			e.done(lat, late)
		}
	}
	start := func(t time.Duration, q queued) {
		n := len(busy) + len(queue)
		service := time.Duration(float64(overBase) * (1 + overSlow*float64(n)/overC))
		heap.Push(&busy, overEvent{at: t + service, arrived: q.arrived, done: q.done})
	}
	// advance completes every request due by t, starting queued ones as
	// servers free up.
	advance := func(t time.Duration) {
		for len(busy) > 0 && busy[0].at <= t {
			e := heap.Pop(&busy).(overEvent)
			finish(e)
			if len(queue) > 0 {
				q := queue[0]
				queue = queue[1:]
				start(e.at, q)
			}
		}
	}
	for _, load := range overLoads {
		rate := load * capacity
		end := now + overStep
		step.offered, step.good, step.shed, step.lat = 0, 0, 0, step.lat[:0]
		for {
			now += time.Duration(-math.Log(1-rng.Float64()) / rate * float64(time.Second))
			if now >= end {
				break
			}
			advance(now)
			clock.Set(at(now.Seconds()))
			step.offered++
			done, ok := c.admit(time.Unix(0, clock.Now()))
			if !ok {
				step.shed++
				continue
			}
			q := queued{arrived: now, done: done}
			if len(busy) < overC {
				start(now, q)
			} else {
				queue = append(queue, q)
			}
		}
		now = end
		advance(now)
		secs := overStep.Seconds()
		row := OverloadRow{Contender: c.name, Load: load, Offered: float64(step.offered) / secs, Goodput: float64(step.good) / secs, Shed: float64(step.shed) / secs}
		if len(step.lat) > 0 {
			slices.Sort(step.lat)
			row.P50Ms = float64(step.lat[len(step.lat)/2].Milliseconds())
			row.P99Ms = float64(step.lat[len(step.lat)*99/100].Milliseconds())
		}
		rows = append(rows, row)
	}
	return rows
}

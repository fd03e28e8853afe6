package sim

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
)

// TokenVsLeakyResult is the JSON form of the token-vs-leaky scenario.
type TokenVsLeakyResult struct {
	Seconds             []TokenVsLeakySecond `json:"seconds"`
	MaxAllowedPerSecond struct {
		TokenBucket int `json:"tokenBucket"`
		LeakyQueue  int `json:"leakyQueue"`
	} `json:"maxAllowedPerSecond"`
	LongestWaitMs int64 `json:"longestWaitMs"`
}

// TokenVsLeakySecond is one second of the scenario.
type TokenVsLeakySecond struct {
	Second      int `json:"second"`
	In          int `json:"in"`
	TokenBucket struct {
		Allowed  int `json:"allowed"`
		Rejected int `json:"rejected"`
	} `json:"tokenBucket"`
	LeakyQueue struct {
		Allowed  int `json:"allowed"`
		Rejected int `json:"rejected"`
		Sent     int `json:"sent"`
	} `json:"leakyQueue"`
}

// tokenVsLeakyArrivals draws the scenario's traffic, seed 7: Poisson
// background at 6/s for 10 s, then bursts of 35 within 0.2 s at 2 s and 6 s.
func tokenVsLeakyArrivals() []float64 {
	rng := NewMulberry32(7)
	var ts []float64
	for t := 0.0; ; {
		t += -math.Log(1-rng.Float64()) / 6
		if t >= 10 {
			break
		}
		ts = append(ts, t)
	}
	for _, s := range []float64{2, 6} {
		for range 35 {
			ts = append(ts, s+rng.Float64()*0.2)
		}
	}
	slices.Sort(ts)
	return ts
}

// TokenVsLeaky runs the same arrivals through a token bucket (r = 10/s,
// b = 20) and a leaky bucket as a queue (r = 10/s, size 20), on the embedded
// store: the bucket passes bursts at once, the queue smooths them into a
// steady 10/s at the price of waiting.
func TokenVsLeaky() (*Report, error) {
	tb, tbClock, err := newLimiter("token-bucket", sluice.Limit{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.TokenBucket})
	if err != nil {
		return nil, err
	}
	lq, lqClock, err := newLimiter("leaky-queue", sluice.Limit{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.LeakyQueue})
	if err != nil {
		return nil, err
	}
	res := TokenVsLeakyResult{Seconds: make([]TokenVsLeakySecond, 10)}
	for i := range res.Seconds {
		res.Seconds[i].Second = i
	}
	var longest time.Duration
	for _, t := range tokenVsLeakyArrivals() {
		sec := &res.Seconds[int(t)]
		sec.In++
		tbClock.Set(at(t))
		if d, _ := tb.Take("k", 1); d.Allowed {
			sec.TokenBucket.Allowed++
		} else {
			sec.TokenBucket.Rejected++
		}
		lqClock.Set(at(t))
		d, _ := lq.Take("k", 1)
		if !d.Allowed {
			sec.LeakyQueue.Rejected++
			continue
		}
		sec.LeakyQueue.Allowed++
		longest = max(longest, d.Delay)
		departure := at(t).Add(d.Delay).Sub(base).Seconds()
		if departure < 10 {
			res.Seconds[int(departure)].LeakyQueue.Sent++
		}
	}
	for _, s := range res.Seconds {
		res.MaxAllowedPerSecond.TokenBucket = max(res.MaxAllowedPerSecond.TokenBucket, s.TokenBucket.Allowed)
		res.MaxAllowedPerSecond.LeakyQueue = max(res.MaxAllowedPerSecond.LeakyQueue, s.LeakyQueue.Sent)
	}
	res.LongestWaitMs = int64(math.Round(float64(longest) / float64(time.Millisecond)))

	rep := &Report{
		Title:   "token-vs-leaky: token bucket (r=10/s, b=20) vs leaky bucket as a queue (r=10/s, size 20); seed 7",
		Columns: []string{"second", "in", "tb allowed", "tb rejected", "queue allowed", "queue rejected", "queue sent"},
		JSON:    res,
		Chart:   &Chart{Lines: true, X: "second", Y: []string{"in", "tb allowed", "queue sent"}, YLabel: "requests per second"},
	}
	for _, s := range res.Seconds {
		rep.Rows = append(rep.Rows, itoa(s.Second, s.In, s.TokenBucket.Allowed, s.TokenBucket.Rejected,
			s.LeakyQueue.Allowed, s.LeakyQueue.Rejected, s.LeakyQueue.Sent))
	}
	rep.Notes = append(rep.Notes,
		"Most allowed in one second: token bucket "+strconv.Itoa(res.MaxAllowedPerSecond.TokenBucket)+
			", queue (sent) "+strconv.Itoa(res.MaxAllowedPerSecond.LeakyQueue)+".",
		"Longest wait in the queue: "+strconv.FormatInt(res.LongestWaitMs, 10)+" ms.")
	return rep, nil
}

func itoa(ns ...int) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = strconv.Itoa(n)
	}
	return out
}

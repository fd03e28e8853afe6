package concurrency

import (
	"math"
	"time"
)

// AIMD grows the limit by one for each success that found the limit
// nearly used (additive increase: in flight at least half the limit), and
// cuts it by Backoff on a drop or a request slower than Timeout
// (multiplicative decrease). Simple and steady; it finds the limit only
// from drops, so the service must shed or time out to be heard.
type AIMD struct {
	Start   int           // the first limit (default 20)
	Backoff float64       // the cut on a drop (default 0.9)
	Timeout time.Duration // a slower request counts as a drop (default 5 s)
}

func (a AIMD) Initial() float64 { return float64(cmpOr(a.Start, 20)) }

func (a AIMD) Update(limit float64, rtt time.Duration, inflight int, dropped bool) float64 {
	backoff := a.Backoff
	if backoff <= 0 || backoff >= 1 {
		backoff = 0.9
	}
	timeout := a.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if dropped || rtt > timeout {
		return limit * backoff
	}
	if float64(inflight)*2 >= limit {
		return limit + 1
	}
	return limit
}

// Gradient2 moves the limit by the ratio of a long-term latency to the
// recent one, as Netflix's Gradient2: while recent requests are as fast as
// usual the limit grows (by a queue allowance of about sqrt(limit)); when
// they slow down, the limit shrinks in proportion, before anything drops.
//
//	gradient = clamp(Tolerance x long / short, 0.5, 1)
//	limit'   = limit x (1 - Smoothing) + (limit x gradient + sqrt(limit)) x Smoothing
//
// short is the mean of recent latencies (an exponential average over
// ShortWindow samples), long a slower one (over LongWindow); a long average
// far above the short one (the service recovered) is pulled down to it so
// that it does not hide the next slowdown.
type Gradient2 struct {
	Start       int     // the first limit (default 20)
	Tolerance   float64 // how much slower than usual counts as slow (default 1.5)
	Smoothing   float64 // how fast the limit moves (default 0.2)
	ShortWindow int     // samples of the recent average (default 10)
	LongWindow  int     // samples of the long-term average (default 600)

	state *gradientState
}

type gradientState struct{ short, long float64 }

// NewGradient2 returns a Gradient2 with its state (the zero value keeps
// none until its first sample; share it with one Limiter only).
func NewGradient2(g Gradient2) *Gradient2 {
	g.state = &gradientState{}
	return &g
}

func (g *Gradient2) Initial() float64 { return float64(cmpOr(g.Start, 20)) }

func (g *Gradient2) Update(limit float64, rtt time.Duration, inflight int, dropped bool) float64 {
	if g.state == nil {
		g.state = &gradientState{}
	}
	tol, sm := orF(g.Tolerance, 1.5), orF(g.Smoothing, 0.2)
	sw, lw := float64(cmpOr(g.ShortWindow, 10)), float64(cmpOr(g.LongWindow, 600))
	x := float64(rtt)
	st := g.state
	if st.short == 0 {
		st.short, st.long = x, x
	}
	st.short += (x - st.short) / sw
	st.long += (x - st.long) / lw
	if st.long > 2*st.short { // recovered: forget the slow past
		st.long = 2 * st.short
	}
	if dropped {
		return limit * 0.9
	}
	if float64(inflight) < limit/2 {
		return limit // too little traffic to learn from
	}
	gradient := math.Max(0.5, math.Min(1, tol*st.long/st.short))
	next := limit*gradient + math.Sqrt(limit)
	return limit*(1-sm) + next*sm
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func orF(v, def float64) float64 {
	if v > 0 {
		return v
	}
	return def
}

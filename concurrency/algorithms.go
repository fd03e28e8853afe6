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

// MinRTT moves the limit by the ratio of the least latency seen to the
// recent one, as Envoy's adaptive concurrency filter does: the least
// latency is what a request takes when nothing queues, so the limit settles
// where requests queue no more than Buffer (default 10%) beyond it.
//
//	gradient = clamp(min x (1 + Buffer) / short, 0.5, 1)
//	limit'   = limit x (1 - Smoothing) + (limit x gradient + headroom) x Smoothing
//
// with headroom 1 while the gradient is 1 (the service keeps up: grow), 0
// otherwise. short is the mean of recent latencies (over ShortWindow
// samples). Envoy re-measures its minimum by pinning the limit low now and
// then; here the minimum forgets instead, rising by Forget (default 0.1%)
// per sample toward what requests take now, so a service that became
// slower for good (its service time doubled) is followed within a few
// thousand samples, without a measuring pause.
type MinRTT struct {
	Start       int     // the first limit (default 20)
	Buffer      float64 // the queueing tolerated beyond the least latency (default 0.1)
	Smoothing   float64 // how fast the limit moves (default 0.1)
	ShortWindow int     // samples of the recent average (default 10)
	Forget      float64 // the least latency's rise per sample (default 0.001)

	state *minRTTState
}

type minRTTState struct{ min, short float64 }

// NewMinRTT returns a MinRTT with its state (share it with one Limiter
// only).
func NewMinRTT(m MinRTT) *MinRTT {
	m.state = &minRTTState{}
	return &m
}

func (m *MinRTT) Initial() float64 { return float64(cmpOr(m.Start, 20)) }

func (m *MinRTT) Update(limit float64, rtt time.Duration, inflight int, dropped bool) float64 {
	if m.state == nil {
		m.state = &minRTTState{}
	}
	st := m.state
	buf, sm := orF(m.Buffer, 0.1), orF(m.Smoothing, 0.1)
	sw, forget := float64(cmpOr(m.ShortWindow, 10)), orF(m.Forget, 0.001)
	x := float64(rtt)
	if st.min == 0 {
		st.min, st.short = x, x
	}
	st.min = math.Min(st.min*(1+forget), x)
	st.short += (x - st.short) / sw
	if dropped {
		return limit * 0.9
	}
	gradient := math.Max(0.5, math.Min(1, st.min*(1+buf)/st.short))
	headroom := 0.0
	if gradient >= 1 && float64(inflight) >= limit/2 {
		headroom = 1
	}
	return limit*(1-sm) + (limit*gradient+headroom)*sm
}

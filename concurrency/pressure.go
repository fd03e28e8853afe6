package concurrency

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Pressure turns what a protected service's answers say into a factor in
// [Floor, 1] that rate limits marked adaptive are multiplied by: 1 while
// the service is healthy, less as it strains, so that by Little's law
// (in flight = rate x latency) fewer requests pile up as each takes longer.
//
// Two signals, each smoothed over Window (an exponentially weighted average
// in time, so bursts of samples weigh as much as their duration):
//
//   - latency: with a Target, the factor is Target / latency once the
//     average latency is above the target (twice the target: half the rate);
//   - failures: the factor is (1 - failures) / (1 - ErrorRate) once the
//     share of failed answers is above ErrorRate (timeouts, 5xx, and
//     requests a concurrency limit shed all count as failed).
//
// The factor is the smaller of the two, never below Floor, and it recovers
// as the averages do; a tick with no answers at all lets them decay, so a
// factor low enough to refuse everything cannot stay low for good. Observe costs three atomic additions; the averages
// and the factor are recomputed at most every Tick, by one caller.
type Pressure struct {
	o PressureOptions

	n, failed, sumNs atomic.Int64 // since the last recompute
	last             atomic.Int64 // time of the last recompute, ns
	factor           atomic.Uint64

	mu             sync.Mutex // the averages, under recompute
	latency, fails float64    // smoothed: ns, share
	seen           bool

	// An operator's factor (Set), applied while it lasts: the factor is
	// then the smaller of it and the measured one.
	set      atomic.Uint64
	setUntil atomic.Int64
}

// PressureOptions configure a Pressure.
type PressureOptions struct {
	// Target is the latency above which the factor falls (0: latency is
	// not a signal).
	Target time.Duration
	// ErrorRate is the share of failed answers tolerated (default 0.05).
	ErrorRate float64
	// Floor is the lowest factor (default 0.1).
	Floor float64
	// Window is the smoothing time constant (default 2 s); Tick how often
	// the factor is recomputed (default 100 ms).
	Window, Tick time.Duration
	// Now reads the time (default time.Now), for tests.
	Now func() time.Time
}

// NewPressure returns a Pressure at factor 1.
func NewPressure(o PressureOptions) *Pressure {
	if o.ErrorRate <= 0 || o.ErrorRate >= 1 {
		o.ErrorRate = 0.05
	}
	if o.Floor <= 0 || o.Floor > 1 {
		o.Floor = 0.1
	}
	if o.Window <= 0 {
		o.Window = 2 * time.Second
	}
	if o.Tick <= 0 {
		o.Tick = 100 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	p := &Pressure{o: o}
	p.factor.Store(math.Float64bits(1))
	p.last.Store(o.Now().UnixNano())
	return p
}

// Observe records one answer of the service: how long it took, and whether
// it failed.
func (p *Pressure) Observe(latency time.Duration, failed bool) {
	p.n.Add(1)
	p.sumNs.Add(int64(latency))
	if failed {
		p.failed.Add(1)
	}
}

// Factor returns the current factor, recomputing it if a Tick has passed.
func (p *Pressure) Factor() float64 {
	now := p.o.Now().UnixNano()
	if last := p.last.Load(); now-last >= int64(p.o.Tick) && p.last.CompareAndSwap(last, now) {
		p.recompute(time.Duration(now - last))
	}
	f := math.Float64frombits(p.factor.Load())
	if now < p.setUntil.Load() {
		f = min(f, math.Float64frombits(p.set.Load()))
	}
	return f
}

// Measured returns the factor from the answers observed, without Set's.
func (p *Pressure) Measured() float64 {
	p.Factor()
	return math.Float64frombits(p.factor.Load())
}

// Set applies factor f (clamped to [Floor, 1]) for d, from a signal that
// Observe cannot see (a database's load, an operator): the factor is the
// smaller of it and the measured one until then. It returns the factor set.
func (p *Pressure) Set(f float64, d time.Duration) float64 {
	f = min(max(f, p.o.Floor), 1)
	p.set.Store(math.Float64bits(f))
	p.setUntil.Store(p.o.Now().Add(d).UnixNano())
	return f
}

// SetUntil returns the factor Set applied and until when (a zero time if
// none applies now).
func (p *Pressure) SetUntil() (float64, time.Time) {
	until := p.setUntil.Load()
	if p.o.Now().UnixNano() >= until {
		return 1, time.Time{}
	}
	return math.Float64frombits(p.set.Load()), time.Unix(0, until)
}

// recompute folds the samples since the last call, dt ago, into the
// averages.
func (p *Pressure) recompute(dt time.Duration) {
	n, failed, sum := p.n.Swap(0), p.failed.Swap(0), p.sumNs.Swap(0)
	p.mu.Lock()
	defer p.mu.Unlock()
	w := 1 - math.Exp(-float64(dt)/float64(p.o.Window))
	switch {
	case n > 0 && !p.seen:
		p.latency, p.fails, p.seen = float64(sum)/float64(n), float64(failed)/float64(n), true
	case n > 0:
		p.latency += w * (float64(sum)/float64(n) - p.latency)
		p.fails += w * (float64(failed)/float64(n) - p.fails)
	default:
		// No answers: nothing says the service is still strained (the
		// limits may be refusing everything), so the averages decay and
		// the factor recovers within a few Windows.
		p.latency -= w * p.latency
		p.fails -= w * p.fails
	}
	f := 1.0
	if t := float64(p.o.Target); t > 0 && p.latency > t {
		f = min(f, t/p.latency)
	}
	if p.fails > p.o.ErrorRate {
		f = min(f, (1-p.fails)/(1-p.o.ErrorRate))
	}
	p.factor.Store(math.Float64bits(max(f, p.o.Floor)))
}

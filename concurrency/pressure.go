package concurrency

import (
	"math"
	"slices"
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
//     latency is above the target (twice the target: half the rate);
//   - failures: the factor is (1 - failures) / (1 - ErrorRate) once the
//     share of failed answers is above ErrorRate (timeouts and 5xx count
//     as failed; a request shed before it reached the service is no answer
//     of the service, and its caller does not observe it).
//
// One client, one vote. Answers are grouped by the client that sent the
// request (Observe's client: a gateway passes its address, an IPv6 one by
// its prefix); each client's latency and failure share are smoothed apart,
// and the signals are the lower median over the clients seen within the
// last two Windows. A client that makes its own requests fail or slow (a
// route that answers it 5xx, an expensive query) moves its own values, not
// the median: to shrink everyone's rate it must be more than half of the
// clients. A service that strains does so for most of its clients and moves
// the median. With one client the signals are that client's; with none for
// two Windows the signals decay, so a factor low enough to refuse
// everything cannot stay low for good. A new client's averages start at the
// current medians: one client's first bad answers move them only part of
// the way.
//
// The factor is the smaller of the two, never below Floor. Observe takes
// one of 16 locks, by client; the averages and the factor are recomputed at
// most every Tick, by one caller. At most 4,096 clients are followed; past
// that the one seen longest ago makes room.
type Pressure struct {
	o PressureOptions

	shards [pressureShards]sampleShard // this Tick's answers, by client
	last   atomic.Int64                // time of the last recompute, ns
	factor atomic.Uint64

	mu      sync.Mutex // under recompute
	clients map[uint64]*clientAverages
	lat     []float64 // scratch for the medians
	fail    []float64
	// The last medians, where a new client's averages start (the first
	// client's start at its own answers), decaying while no client speaks.
	prior clientAverages
	seen  bool

	// An operator's factor (Set), applied while it lasts: the factor is
	// then the smaller of it and the measured one.
	set      atomic.Uint64
	setUntil atomic.Int64
}

const (
	pressureShards     = 16
	maxShardClients    = 256 // per shard and Tick; beyond, answers join one "others" client
	maxPressureClients = 4096
	othersClient       = ^uint64(0)
)

type sampleShard struct {
	mu sync.Mutex
	m  map[uint64]samples
}

type samples struct{ n, failed, sumNs int64 }

// clientAverages are one client's smoothed signals.
type clientAverages struct {
	latency, fails float64 // ns, share
	seen           int64   // last answer, ns
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
	p := &Pressure{o: o, clients: map[uint64]*clientAverages{}}
	for i := range p.shards {
		p.shards[i].m = map[uint64]samples{}
	}
	p.factor.Store(math.Float64bits(1))
	p.last.Store(o.Now().UnixNano())
	return p
}

// Observe records one answer of the service to client (a number that
// stands for who sent the request, such as a hash of its address): how long
// it took, and whether it failed.
func (p *Pressure) Observe(client uint64, latency time.Duration, failed bool) {
	sh := &p.shards[client%pressureShards]
	sh.mu.Lock()
	s, ok := sh.m[client]
	if !ok && len(sh.m) >= maxShardClients {
		client = othersClient
		s = sh.m[client]
	}
	s.n++
	s.sumNs += int64(latency)
	if failed {
		s.failed++
	}
	sh.m[client] = s
	sh.mu.Unlock()
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

// recompute folds the answers since the last call, dt ago, into each
// client's averages, and the factor from their lower medians.
func (p *Pressure) recompute(dt time.Duration) {
	now := p.o.Now().UnixNano()
	w := 1 - math.Exp(-float64(dt)/float64(p.o.Window))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		for c, s := range sh.m {
			p.fold(c, s, w, now)
		}
		clear(sh.m)
		sh.mu.Unlock()
	}
	p.lat, p.fail = p.lat[:0], p.fail[:0]
	for c, a := range p.clients {
		if now-a.seen > 2*int64(p.o.Window) {
			delete(p.clients, c) // gone quiet: no longer a voice
			continue
		}
		p.lat, p.fail = append(p.lat, a.latency), append(p.fail, a.fails)
	}
	if len(p.lat) > 0 {
		p.prior.latency, p.prior.fails = lowerMedian(p.lat), lowerMedian(p.fail)
	} else {
		// No client: nothing says the service is still strained (the
		// limits may be refusing everything), so the signals decay and
		// the factor recovers within a few Windows.
		p.prior.latency -= w * p.prior.latency
		p.prior.fails -= w * p.prior.fails
	}
	f := 1.0
	if t := float64(p.o.Target); t > 0 && p.prior.latency > t {
		f = min(f, t/p.prior.latency)
	}
	if p.prior.fails > p.o.ErrorRate {
		f = min(f, (1-p.prior.fails)/(1-p.o.ErrorRate))
	}
	p.factor.Store(math.Float64bits(max(f, p.o.Floor)))
}

// fold adds one client's answers of a Tick to its averages.
func (p *Pressure) fold(c uint64, s samples, w float64, now int64) {
	latency, fails := float64(s.sumNs)/float64(s.n), float64(s.failed)/float64(s.n)
	a := p.clients[c]
	if a == nil {
		if len(p.clients) >= maxPressureClients {
			var oldest uint64
			at := int64(math.MaxInt64)
			for k, v := range p.clients {
				if v.seen < at {
					oldest, at = k, v.seen
				}
			}
			delete(p.clients, oldest)
		}
		a = &clientAverages{latency: latency, fails: fails}
		if p.seen {
			a.latency, a.fails = p.prior.latency, p.prior.fails
			a.latency += w * (latency - a.latency)
			a.fails += w * (fails - a.fails)
		}
		p.seen = true
		a.seen = now
		p.clients[c] = a
		return
	}
	a.latency += w * (latency - a.latency)
	a.fails += w * (fails - a.fails)
	a.seen = now
}

// lowerMedian returns the lower median of v, reordering it.
func lowerMedian(v []float64) float64 {
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// Package concurrency limits the requests in flight, with a limit that
// follows the protected service: a fixed rate keeps admitting 200 requests
// a second when each starts taking five times longer, and by Little's law
// (in flight = rate x latency) five times as many pile up. A concurrency
// limit bounds the pile instead, and an adaptive one moves itself from
// measured latency and drops, as Netflix's concurrency-limits does
// (AIMD, Gradient2) and Envoy's adaptive concurrency filter.
//
//	l := concurrency.New(concurrency.NewGradient2(concurrency.Gradient2{}), concurrency.Options{Min: 4, Max: 1000})
//	p, err := l.Acquire(ctx)
//	if err != nil { /* shed: 503 */ }
//	defer p.Release(concurrency.Success) // or Dropped, Ignore
//
// Acquire and Release allocate nothing; the limit is updated under a mutex
// on Release only. An optional queue holds a bounded number of waiters for
// at most a deadline, instead of refusing at once.
package concurrency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLimited is returned by Acquire when the limit is reached and the
// request could not wait (no queue, the queue full, or its deadline).
var ErrLimited = errors.New("concurrency: limit reached")

// Outcome is how a request that held a permit ended.
type Outcome uint8

const (
	// Success: the request completed; its latency is a sample.
	Success Outcome = iota
	// Dropped: the request failed from overload (a timeout, a 503 from the
	// service): the limit backs off.
	Dropped
	// Ignore: the request ended without a useful sample (a client error).
	Ignore
)

// Algorithm moves a limit from samples. Update is called under the
// limiter's lock with the current limit, the latency of a request, the
// requests in flight when it started, and whether it was dropped; it
// returns the new limit (the limiter clamps it to [Min, Max]).
type Algorithm interface {
	Update(limit float64, rtt time.Duration, inflight int, dropped bool) float64
	Initial() float64
}

// Options bound a Limiter.
type Options struct {
	Min, Max int // the limit's bounds (defaults 1 and 1000)
	// Queue, when > 0, lets up to Queue requests wait for a permit, each
	// for at most QueueTimeout (default 50 ms), instead of refusing at once.
	Queue        int
	QueueTimeout time.Duration
	// Now reads the time (default time.Now), for tests.
	Now func() time.Time
	// Tiers, when set, keep a share of the limit for each priority level
	// (by index, 0 the highest) from the levels below it: a request of
	// level i takes a permit only while fewer than limit x (1 - the shares
	// of levels 0..i-1) are held (see AcquireAt). As the limit falls, the
	// lowest levels are shed first.
	Tiers []float64
}

// Limiter hands out permits while fewer than its limit are held.
type Limiter struct {
	alg Algorithm
	o   Options

	inflight atomic.Int64
	limit    atomic.Int64  // the integer limit Acquire compares with
	shed     atomic.Uint64 // requests refused

	above []float64 // per level, the shares of the levels above it

	mu      sync.Mutex
	exact   float64 // the algorithm's limit, before rounding
	waiting atomic.Int64
	// Per priority level, the requests in the queue, and a token per
	// permit released while some wait: a released permit wakes the
	// highest level waiting.
	waitingAt []atomic.Int64
	wake      []chan struct{}
	shedAt    []atomic.Uint64 // requests refused, by level
}

// New returns a Limiter moving its limit with alg (Fixed{N} for a fixed
// limit).
func New(alg Algorithm, o Options) *Limiter {
	if o.Min <= 0 {
		o.Min = 1
	}
	if o.Max <= 0 {
		o.Max = 1000
	}
	o.Max = max(o.Max, o.Min)
	if o.QueueTimeout <= 0 {
		o.QueueTimeout = 50 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	l := &Limiter{alg: alg, o: o}
	levels := len(o.Tiers) + 1
	l.waitingAt = make([]atomic.Int64, levels)
	l.shedAt = make([]atomic.Uint64, levels)
	l.wake = make([]chan struct{}, levels)
	for i := range l.wake {
		l.wake[i] = make(chan struct{}, max(o.Queue, 1))
	}
	sum := 0.0
	for _, s := range o.Tiers {
		l.above = append(l.above, sum)
		sum += s
	}
	l.above = append(l.above, sum) // a level past the last named
	l.set(alg.Initial())
	return l
}

func (l *Limiter) set(v float64) {
	v = min(max(v, float64(l.o.Min)), float64(l.o.Max))
	l.exact = v
	l.limit.Store(int64(v))
}

// Limit returns the current limit; InFlight the permits held.
func (l *Limiter) Limit() int    { return int(l.limit.Load()) }
func (l *Limiter) InFlight() int { return int(l.inflight.Load()) }

// Shed returns how many requests Acquire has refused.
func (l *Limiter) Shed() uint64 { return l.shed.Load() }

// ShedAt returns how many requests of priority level AcquireAt has refused
// (levels past the last of Options.Tiers count as the last).
func (l *Limiter) ShedAt(level int) uint64 {
	return l.shedAt[min(max(level, 0), len(l.shedAt)-1)].Load()
}

// refuse counts a refusal at level.
func (l *Limiter) refuse(level int) error {
	l.shed.Add(1)
	l.shedAt[min(max(level, 0), len(l.shedAt)-1)].Add(1)
	return ErrLimited
}

// Permit is a held place under the limit; release it once.
type Permit struct {
	l        *Limiter
	start    time.Time
	inflight int
}

// Acquire takes a permit if fewer than the limit are held, or waits in the
// queue (if any) for one, within ctx.
func (l *Limiter) Acquire(ctx context.Context) (Permit, error) { return l.AcquireAt(ctx, 0) }

// AcquireAt is Acquire for a request of priority level (0 the highest; see
// Options.Tiers): it takes a permit only while the shares kept for the
// levels above it are free.
func (l *Limiter) AcquireAt(ctx context.Context, level int) (Permit, error) {
	if p, ok := l.tryAcquire(level); ok {
		return p, nil
	}
	if l.o.Queue <= 0 {
		return Permit{}, l.refuse(level)
	}
	if l.waiting.Add(1) > int64(l.o.Queue) {
		l.waiting.Add(-1)
		return Permit{}, l.refuse(level)
	}
	defer l.waiting.Add(-1)
	at := min(max(level, 0), len(l.wake)-1)
	l.waitingAt[at].Add(1)
	defer l.waitingAt[at].Add(-1)
	timer := time.NewTimer(l.o.QueueTimeout)
	defer timer.Stop()
	for {
		select {
		case <-l.wake[at]:
			if p, ok := l.tryAcquire(level); ok {
				return p, nil
			}
		case <-timer.C:
			return Permit{}, l.refuse(level)
		case <-ctx.Done():
			return Permit{}, ctx.Err()
		}
	}
}

func (l *Limiter) tryAcquire(level int) (Permit, bool) {
	for {
		n, limit := l.inflight.Load(), l.limit.Load()
		if level > 0 && len(l.o.Tiers) > 0 {
			limit -= int64(float64(limit) * l.above[min(level, len(l.above)-1)])
		}
		if n >= limit {
			return Permit{}, false
		}
		if l.inflight.CompareAndSwap(n, n+1) {
			return Permit{l: l, start: l.o.Now(), inflight: int(n + 1)}, true
		}
	}
}

// Release gives the permit back, with how its request ended, and moves the
// limit by the sample.
func (p Permit) Release(o Outcome) {
	l := p.l
	if l == nil {
		return
	}
	if o != Ignore {
		rtt := l.o.Now().Sub(p.start)
		l.mu.Lock()
		l.set(l.alg.Update(l.exact, rtt, p.inflight, o == Dropped))
		l.mu.Unlock()
	}
	l.inflight.Add(-1)
	if l.waiting.Load() > 0 {
		for i := range l.wake { // the highest level waiting tries again
			if l.waitingAt[i].Load() > 0 {
				select {
				case l.wake[i] <- struct{}{}:
					return
				default:
				}
			}
		}
	}
}

// Fixed is a fixed limit: the baseline.
type Fixed struct{ N int }

func (f Fixed) Initial() float64                                             { return float64(max(f.N, 1)) }
func (f Fixed) Update(limit float64, _ time.Duration, _ int, _ bool) float64 { return limit }

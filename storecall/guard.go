package storecall

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sony/gobreaker/v2"
)

// A remote store is guarded by a deadline on every call and a circuit
// breaker per store node. Both are built so that a healthy store under load
// is never mistaken for a failed one, while a dead or hung store is still
// found within a documented bound:
//
//   - The deadline adapts to the store's observed latency: four times the
//     recent peak latency, clamped to [MinTimeout, MaxTimeout]
//     (50 ms to 250 ms by default), starting at the cap. A success is a
//     latency sample; a call that
//     misses its deadline counts as a sample of the whole deadline, so a
//     store whose latency jumps (a slower network, a loaded Redis) is given
//     four times longer on the next calls and is soon answered in time
//     again, instead of being taken for dead at its old speed forever. A
//     hung store climbs to the cap: a request waits at most MaxTimeout
//     for it. Fast successes bring the deadline back down. A fixed
//     Options.Timeout replaces the adaptive deadline.
//   - A breaker opens on a failure rate, not a streak: at least
//     BreakerFailures (20) failed calls that are at least half of the calls in
//     the last BreakerWindow (10 s, counted in 1 s buckets). Open, it fails
//     calls at once for BreakerOpenFor (1 s), then lets one probe through. A
//     dead store (connection refused) therefore opens the breaker after 20
//     calls; a hung one after 20 calls that each waited one deadline (with 64
//     callers, about one deadline) on a quiet gateway. On a busy one the
//     window's earlier successes count too, and a hang of a few seconds may
//     never reach half: each request then waits its deadline, no more.
//   - Breakers are per partition of the store (see Partitioner): on Redis
//     Cluster a stopped master opens only its own breaker, and only the keys
//     it owns are degraded.
//   - Only the store's own failures count. A call is detached from its
//     client (see Client.Take), so clients that hang up or send tiny gRPC
//     deadlines never count as failures; and a process too busy to read
//     the store's reply in time is given the time it lately took to run a
//     goroutine (see schedWatch), so that its own slowness is not taken
//     for the store's.

// Partitioner is implemented by stores made of independent nodes, such as
// Redis Cluster: Partition names the node that serves a take's key, and the
// client keeps a breaker per node.
type Partitioner interface {
	Partition(t *sluice.Take) string
}

// Defaults of the store guard.
const (
	MinTimeout             = 50 * time.Millisecond
	MaxTimeout             = 250 * time.Millisecond
	DefaultBreakerFailures = 20
	DefaultBreakerWindow   = 10 * time.Second
	DefaultBreakerOpenFor  = time.Second
)

// latency keeps the recent peak latency of successful store calls: a new
// sample above it replaces it, one below it pulls it down by 1/64 of the
// gap, so the estimate follows a store that speeds up within a few hundred
// calls and one that slows down at once.
type latency struct{ peak atomic.Int64 }

func (l *latency) observe(d time.Duration) {
	for {
		old := l.peak.Load()
		next := max(int64(d), old-(old-int64(d))/64) // d itself when higher
		if l.peak.CompareAndSwap(old, next) {
			return
		}
	}
}

// guard holds a store's deadline and breakers.
type guard struct {
	fixed    time.Duration // a fixed deadline, or 0 for the adaptive one
	min, max time.Duration
	lat      latency
	settings gobreaker.Settings
	sched    schedWatch // this process's own scheduling latency
	mu       sync.Mutex
	breakers atomic.Pointer[map[string]*gobreaker.CircuitBreaker[struct{}]] // copy-on-write
}

func newGuard(o *Options, onChange func(partition, from, to string)) *guard {
	g := &guard{fixed: o.Timeout, min: MinTimeout, max: MaxTimeout}
	if o.TimeoutMax > 0 {
		g.max = o.TimeoutMax
		g.min = min(g.min, g.max)
	}
	failures := o.BreakerFailures
	if failures == 0 {
		failures = DefaultBreakerFailures
	}
	window := o.BreakerWindow
	if window <= 0 {
		window = DefaultBreakerWindow
	}
	openFor := o.BreakerOpenFor
	if openFor <= 0 {
		openFor = DefaultBreakerOpenFor
	}
	g.settings = gobreaker.Settings{
		MaxRequests:  1,
		Interval:     window,
		BucketPeriod: max(window/10, time.Millisecond),
		Timeout:      openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.TotalFailures >= failures && 2*c.TotalFailures >= c.Requests
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			onChange(name, from.String(), to.String())
		},
	}
	empty := map[string]*gobreaker.CircuitBreaker[struct{}]{}
	g.breakers.Store(&empty)
	// Start at the cap and learn down: the first calls, which pay for
	// connecting and loading scripts, on a machine that may be busy, are
	// not taken for failures; fast answers bring the deadline down within a
	// few hundred calls.
	g.lat.peak.Store(int64(g.max / 4))
	return g
}

// deadline returns the deadline of the next call.
func (g *guard) deadline() time.Duration {
	if g.fixed > 0 {
		return g.fixed
	}
	return min(max(4*time.Duration(g.lat.peak.Load()), g.min), g.max)
}

// breaker returns the breaker of a partition, making it on first use.
func (g *guard) breaker(partition string) *gobreaker.CircuitBreaker[struct{}] {
	if b := (*g.breakers.Load())[partition]; b != nil {
		return b
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.breakers.Load()
	if b := old[partition]; b != nil {
		return b
	}
	partition = strings.Clone(partition) // it may be a view of a request's reused key buffer
	st := g.settings
	st.Name = partition
	b := gobreaker.NewCircuitBreaker[struct{}](st)
	next := maps.Clone(old) // never nil: the first map is made empty
	next[partition] = b
	g.breakers.Store(&next)
	return b
}

// call runs one guarded store call. wait, when above the call's deadline,
// is how long its caller waits for a store that is slow but answering
// (a rule's onSlowStore: wait) before it answers without it.
func (g *guard) call(ctx context.Context, s sluice.Store, partition string, wait time.Duration, takes []sluice.Take, out []sluice.Decision) error {
	start := time.Now()
	ext := g.sched.extension(start.UnixNano())
	deadline := g.deadline()
	ctx, cancel := context.WithTimeout(ctx, max(deadline+ext, wait))
	defer cancel()
	b := g.breaker(partition)
	var err error
	if wait > 0 && b.State() != gobreaker.StateClosed {
		// A rule that waits for a slow store (onSlowStore: wait) is never
		// answered by a breaker that other rules' calls past their
		// deadline opened: it is sent, and waits, whatever the breaker
		// says, so that it is never over while the store answers within
		// its wait. A dead store then costs its requests their wait.
		err = s.Take(ctx, takes, out)
	} else {
		_, err = b.Execute(func() (struct{}, error) {
			return struct{}{}, s.Take(ctx, takes, out)
		})
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			return ErrBreakerOpen
		}
	}
	switch {
	case err == nil:
		// The store's latency, less what waiting to run added to it.
		g.lat.observe(max(time.Since(start)-ext/4, 0))
	case g.fixed == 0 && errors.Is(err, context.DeadlineExceeded):
		g.lat.observe(deadline) // it took at least this long
	}
	return err
}

// states returns every partition's breaker state.
func (g *guard) states() map[string]string {
	m := map[string]string{}
	for p, b := range *g.breakers.Load() {
		m[p] = b.State().String()
	}
	return m
}

// worst returns the worst breaker state over the partitions: open, then
// half-open, then closed.
func (g *guard) worst() string {
	rank := map[string]int{"closed": 0, "half-open": 1, "open": 2}
	w := "closed"
	for _, s := range g.states() {
		if rank[s] > rank[w] {
			w = s
		}
	}
	return w
}

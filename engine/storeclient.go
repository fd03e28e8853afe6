package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// StoreClient is the engine's only way to its store: every take, charge,
// refund, write-back and ping goes through it. It owns what a call to a
// remote store needs and a rule set does not:
//
//   - the deadline and the per-node circuit breakers (guard.go);
//   - the grace that lets a reply arriving just after its deadline still
//     be credited, and the workers that run calls under it (late.go);
//   - the ledger of degraded admissions still owed to the store, and their
//     write-back (owed.go).
//
// An embedded store, which never blocks, gets none of these: its calls go
// straight to it. The engine decides what to take; the client decides
// only how a call reaches the store and what a failed or late one leaves
// owed.
type StoreClient struct {
	store   sluice.Store
	local   bool        // the store never blocks (sluice.NonBlocking)
	parts   Partitioner // nil unless the store has independent nodes
	guard   *guard
	openFor time.Duration
	onCall  func(time.Duration, error)
	log     *slog.Logger

	reached   atomic.Bool // the store has answered since start
	answering atomic.Bool // the last store call succeeded (see owed: late debts)
	owed      owed        // degraded admissions to charge to the store

	// owesRule reports whether a rule writes its degraded admissions back
	// (the engine's rule set knows; the client asks when a late reply
	// lands).
	owesRule func(rule string) bool

	// Store calls run graced (see late.go): calls, and calls whose caller
	// answers a failure for the store.
	calls, owingCalls graced
	lateGrace         time.Duration
	workers           workers
	reaper            reaper
}

// ErrBreakerOpen is the store error while the circuit breaker is open.
var ErrBreakerOpen = errors.New("engine: store circuit breaker is open")

func newStoreClient(o *Options, log *slog.Logger, owesRule func(rule string) bool) *StoreClient {
	c := &StoreClient{store: o.Store, onCall: o.OnStoreCall, log: log, owesRule: owesRule}
	_, c.local = o.Store.(sluice.NonBlocking)
	c.parts, _ = o.Store.(Partitioner)
	c.openFor = o.BreakerOpenFor
	if c.openFor <= 0 {
		c.openFor = DefaultBreakerOpenFor
	}
	c.guard = newGuard(o, func(partition, from, to string) {
		// One line per transition of one partition's breaker.
		node := partition
		if node == "" {
			node = o.StoreName
		}
		c.log.Warn("sluice: store circuit breaker", "node", node, "from", from, "to", to)
		if o.OnBreakerChange != nil {
			o.OnBreakerChange(from, to)
		}
	})
	c.calls, c.owingCalls = graced{c: c}, graced{c: c, owes: true}
	c.lateGrace, c.workers.work = lateGrace, make(chan *storeCall)
	return c
}

// Store returns the engine's store client.
func (e *Engine) Store() *StoreClient { return e.client }

// call makes one store call, bounded by the deadline and the breaker of the
// store node it goes to, unless the store never blocks.
//
// The call does not end when the client goes: it is detached from ctx's
// cancellation and deadline and bounded by the store deadline alone. A
// client that hangs up, or sends a gRPC deadline of 200µs, therefore can
// neither make a started take vanish half-accounted nor count as a store
// failure towards the breaker: only the store's own failures do.
//
// A store that never blocks gets context.Background() instead: it has no
// use for the request's values, and wrapping ctx would be an allocation on
// every check.
func (c *StoreClient) call(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	return c.callVia(ctx, &c.calls, 0, takes, out)
}

// callVia is call through s: c.calls, or c.owingCalls for a caller that
// answers a failed call from the gateway's share (see late.go); wait is
// how long the caller waits for a slow store (see guard.call).
func (c *StoreClient) callVia(ctx context.Context, s *graced, wait time.Duration, takes []sluice.Take, out []sluice.Decision) error {
	if c.local {
		return c.store.Take(context.Background(), takes, out)
	}
	ctx = context.WithoutCancel(ctx)
	partition := ""
	if c.parts != nil && len(takes) > 0 {
		partition = c.parts.Partition(&takes[0])
	}
	start := time.Now()
	err := c.guard.call(ctx, s, partition, wait, takes, out)
	if c.onCall != nil {
		c.onCall(time.Since(start), err)
	}
	if err == nil {
		if !c.reached.Load() {
			c.reached.Store(true)
		}
		if !c.answering.Load() {
			c.answering.Store(true)
		}
		c.owed.kick(c) // the store answers: charge it what was admitted without it
	} else if c.answering.Load() {
		c.answering.Store(false)
	}
	return err
}

// Reached reports whether the store has answered a call since the engine
// started (always true for a store that never blocks). A store that has
// never answered may be misnamed rather than down: readiness says so.
func (c *StoreClient) Reached() bool { return c.local || c.reached.Load() }

// Preloader is implemented by stores that load something once before they
// can answer promptly, such as the Redis store's scripts.
type Preloader interface {
	Preload(ctx context.Context) error
}

// Ping checks that the store answers: its preload (if any), then one peek
// on a key of its own.
func (c *StoreClient) Ping(ctx context.Context) error {
	if p, ok := c.store.(Preloader); ok {
		ctx, cancel := context.WithTimeout(ctx, time.Second) // loading scripts on every node
		err := p.Preload(ctx)
		cancel()
		if err != nil {
			return err
		}
	}
	var out [1]sluice.Decision
	return c.call(ctx, []sluice.Take{{Rule: "sluice#ping", Key: "ping", Limit: pingLimit}}, out[:])
}

var pingLimit = sluice.Limit{Rate: 1, Period: time.Second}

// BreakerState returns the worst state of the store's circuit breakers
// (one per store node): "closed", "half-open" or "open".
func (c *StoreClient) BreakerState() string { return c.guard.worst() }

// BreakerStates returns the state of each store node's circuit breaker, by
// node ("" for a store of one node).
func (c *StoreClient) BreakerStates() map[string]string { return c.guard.states() }

// Guarded reports whether store calls are guarded by a deadline and
// breakers: a remote store's are; an embedded one, which never blocks,
// needs neither.
func (c *StoreClient) Guarded() bool { return !c.local }

// Deadline returns the deadline a store call gets now, and the part of it
// that this process's recent scheduling latency adds (see guard.go).
func (c *StoreClient) Deadline() (deadline, scheduling time.Duration) {
	ext := time.Duration(c.guard.sched.delay.Load())
	return c.guard.deadline() + ext, ext
}

// Workers returns how many goroutines run store calls (see late.go), and
// how many of them wait for work.
func (c *StoreClient) Workers() (running, idle int64) {
	return c.workers.n.Load(), c.workers.idle.Load()
}

// breakerRetry suggests when to retry a request refused for a failing store:
// when the breaker will next let a probe through.
func (c *StoreClient) breakerRetry() time.Duration { return c.openFor }

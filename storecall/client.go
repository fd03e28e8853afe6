package storecall

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// Options configure a Client. The zero value is the default.
type Options struct {
	// Timeout, if set, is a fixed deadline for every call. By default the
	// deadline adapts to the store's latency (see guard.go): four times its
	// recent peak, within [MinTimeout, TimeoutMax]. Stores that never block
	// (sluice.NonBlocking) are called without one.
	Timeout time.Duration
	// TimeoutMax caps the adaptive deadline (default MaxTimeout).
	TimeoutMax time.Duration
	// BreakerFailures is how many failed calls, at least half of the calls
	// within BreakerWindow, open a partition's circuit breaker (defaults 20
	// and 10 s); BreakerOpenFor is how long it stays open before letting
	// one probe through (default 1 s).
	BreakerFailures uint32
	BreakerWindow   time.Duration
	BreakerOpenFor  time.Duration
	// OnBreakerChange, if set, is told of every breaker state change.
	OnBreakerChange func(from, to string)
	// Name names the store in the breaker's log lines when it is one node
	// (a store that is not a Partitioner): its URL, without secrets.
	Name string
	// OnCall, if set, is told how long each call to a blocking store took
	// and how it ended (nil, a store error, a deadline, ErrBreakerOpen):
	// for metrics.
	OnCall func(d time.Duration, err error)
	// LateGrace is how long past its deadline a call is followed, so that
	// a reply that comes in it is credited (late.go): default 5 s; a
	// negative grace follows no call.
	LateGrace time.Duration
	// WriteBackEvery spaces the write-backs of what is owed (owed.go): a
	// store that answers while many keys are owed is charged in one go,
	// not once per call. Default 100 ms; negative: only Flush and
	// WriteBack write back, for a caller that keeps its own schedule.
	WriteBackEvery time.Duration
	// Logger receives the breakers' transitions (default slog.Default()).
	Logger *slog.Logger
}

// Client is the one way to a store: every take, charge, refund,
// write-back and ping goes through its Take. It owns what a call to a
// remote store needs and a rule set does not:
//
//   - the deadline and the per-node circuit breakers (guard.go), the
//     deadline stretched by this process's own scheduling delay (sched.go);
//   - the grace that lets a reply arriving just after its deadline still
//     be credited, and the workers that run calls under it (late.go);
//   - the ledger of admissions made without the store and still owed to
//     it, and their write-back (owed.go).
//
// An embedded store, which never blocks, gets none of these: its calls go
// straight to it. The caller decides what to take and how to answer a
// failed call; the client decides only how a call reaches the store and
// what a failed or late one leaves owed.
type Client struct {
	store   sluice.Store
	local   bool        // the store never blocks (sluice.NonBlocking)
	parts   Partitioner // nil unless the store has independent nodes
	guard   *guard
	openFor time.Duration
	onCall  func(time.Duration, error)

	reached   atomic.Bool // the store has answered since start
	answering atomic.Bool // the last store call succeeded (see owed: late debts)
	owed      owed        // admissions made without the store, to charge to it

	// owesRule reports whether a rule writes what it admitted without the
	// store back (the caller's rule set knows; the client asks when a late
	// reply lands).
	owesRule func(rule string) bool

	// Calls run graced (see late.go): plain calls, and the calls of a
	// caller that answers a failure from its own share.
	calls, owingCalls graced
	lateGrace         time.Duration
	workers           workers
	reaper            reaper
}

// Call says how one call is made.
type Call struct {
	// Owing marks a request's own takes, whose failure the caller answers
	// on its own and owes (Owe): the debts of their keys ride in the same
	// atomic call, charged before they are decided, and a reply after the
	// deadline is credited against what the failure owed (late.go).
	Owing bool
	// Wait, when above the call's deadline, is how long the caller waits
	// for a store that is slow but answering (a rule's onSlowStore: wait)
	// before the call fails.
	Wait time.Duration
	// Spent, if set, has the time the call waited for a remote store added
	// to it.
	Spent *time.Duration
}

// ErrBreakerOpen is the error of a call while the circuit breaker of its
// store node is open.
var ErrBreakerOpen = errors.New("storecall: store circuit breaker is open")

// New returns a client of store. owesRule reports whether what a rule
// admitted without the store is owed to it (nil: every rule's is).
func New(store sluice.Store, owesRule func(rule string) bool, o Options) *Client {
	if owesRule == nil {
		owesRule = func(string) bool { return true }
	}
	c := &Client{store: store, onCall: o.OnCall, owesRule: owesRule}
	_, c.local = store.(sluice.NonBlocking)
	c.parts, _ = store.(Partitioner)
	c.openFor = o.BreakerOpenFor
	if c.openFor <= 0 {
		c.openFor = DefaultBreakerOpenFor
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	c.guard = newGuard(&o, func(partition, from, to string) {
		// One line per transition of one partition's breaker.
		node := partition
		if node == "" {
			node = o.Name
		}
		log.Warn("sluice: store circuit breaker", "node", node, "from", from, "to", to)
		if o.OnBreakerChange != nil {
			o.OnBreakerChange(from, to)
		}
	})
	c.calls, c.owingCalls = graced{c: c}, graced{c: c, owes: true}
	switch {
	case o.LateGrace < 0:
		c.lateGrace = 0
	case o.LateGrace == 0:
		c.lateGrace = lateGrace
	default:
		c.lateGrace = o.LateGrace
	}
	c.workers.work = make(chan *storeCall)
	c.owed.every = o.WriteBackEvery
	if c.owed.every == 0 {
		c.owed.every = flushEvery
	}
	return c
}

// Take makes one store call of takes, their decisions in out, as how
// says: the one verb for a call to the store.
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
func (c *Client) Take(ctx context.Context, how Call, takes []sluice.Take, out []sluice.Decision) error {
	if how.Spent == nil || c.local {
		return c.take(ctx, how, takes, out)
	}
	start := time.Now()
	err := c.take(ctx, how, takes, out)
	*how.Spent += time.Since(start)
	return err
}

func (c *Client) take(ctx context.Context, how Call, takes []sluice.Take, out []sluice.Decision) error {
	if !how.Owing {
		return c.send(ctx, &c.calls, how.Wait, takes, out)
	}
	if c.owed.pending.Load() {
		return c.takeWithDebts(ctx, how.Wait, takes, out)
	}
	return c.send(ctx, &c.owingCalls, how.Wait, takes, out)
}

// send makes one call through s: c.calls, or c.owingCalls for a caller
// that answers a failed call from its own share (see late.go); wait is
// how long the caller waits for a slow store (see guard.call).
func (c *Client) send(ctx context.Context, s *graced, wait time.Duration, takes []sluice.Take, out []sluice.Decision) error {
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

// Reached reports whether the store has answered a call since the client
// was made (always true for a store that never blocks). A store that has
// never answered may be misnamed rather than down: readiness says so.
func (c *Client) Reached() bool { return c.local || c.reached.Load() }

// Preloader is implemented by stores that load something once before they
// can answer promptly, such as the Redis store's scripts.
type Preloader interface {
	Preload(ctx context.Context) error
}

// Ping checks that the store answers: its preload (if any), then one peek
// on a key of its own.
func (c *Client) Ping(ctx context.Context) error {
	if p, ok := c.store.(Preloader); ok {
		ctx, cancel := context.WithTimeout(ctx, time.Second) // loading scripts on every node
		err := p.Preload(ctx)
		cancel()
		if err != nil {
			return err
		}
	}
	var out [1]sluice.Decision
	return c.Take(ctx, Call{}, []sluice.Take{{Rule: "sluice#ping", Key: "ping", Limit: pingLimit}}, out[:])
}

var pingLimit = sluice.Limit{Rate: 1, Period: time.Second}

// BreakerState returns the worst state of the store's circuit breakers
// (one per store node): "closed", "half-open" or "open".
func (c *Client) BreakerState() string { return c.guard.worst() }

// BreakerStates returns the state of each store node's circuit breaker, by
// node ("" for a store of one node).
func (c *Client) BreakerStates() map[string]string { return c.guard.states() }

// Guarded reports whether calls are guarded by a deadline and breakers: a
// remote store's are; an embedded one, which never blocks, needs neither.
func (c *Client) Guarded() bool { return !c.local }

// Deadline returns the deadline a call gets now, and the part of it that
// this process's recent scheduling latency adds (see guard.go).
func (c *Client) Deadline() (deadline, scheduling time.Duration) {
	ext := time.Duration(c.guard.sched.delay.Load())
	return c.guard.deadline() + ext, ext
}

// Workers returns how many goroutines run calls (see late.go), and how
// many of them wait for work.
func (c *Client) Workers() (running, idle int64) {
	return c.workers.n.Load(), c.workers.idle.Load()
}

// RetryAfterFailure suggests when a request refused for a failing store
// may try again: when the breaker next lets a probe through.
func (c *Client) RetryAfterFailure() time.Duration { return c.openFor }

package storecall

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/view"
)

// A store call that misses its deadline is answered at once by its caller
// (from a gateway's share, say), but it is not abandoned: it may already be
// on its way, and a store that was only slow (a Redis starved of CPU, or a
// gateway too busy to read the reply in time) applies it. Abandoned, such a
// call is counted twice: once by the store, and once more when the
// degraded admission it led to is charged to the store (see owed), so its
// key is refused before its limit. Instead the call goes on, in a
// goroutine of its own, for lateGrace past its deadline, and if the store's
// reply comes, what the store counted is credited against the key's debt:
//
//   - A charge the call carried was applied: it had been owed again when
//     the call missed its deadline, and the credit cancels that. So is a
//     refund a write-back carried (a credit given back): it had been owed
//     back again, and is not given back twice.
//   - The call's takes were admitted (a store applies a call's takes all or
//     none, see sluice.Store): each take of a rule whose count lives in
//     the store (owesRule) is credited its cost. If the rule failed open
//     and its degraded answer admitted, it owed the cost, and debt and
//     credit net to zero; if it refused (its share spent, or the rule
//     fails closed), the credit stands, and the write-back gives it back
//     to the store as a refund take.
//
// Debts and credits add up in one ledger entry per key, whichever comes
// first, and a debt charged before its credit came is refunded by it: the
// store's count converges to exactly what was admitted, under in between,
// never over. A reply that does not come within the grace (the store died
// holding the call, or stayed hung) leaves the ledger as the deadline left
// it, as does an error: the debt is charged once the store answers, which
// counts a unit twice only if the lost call had in fact been applied.
//
// A countOn rule's charge after the response is credited too: its failure
// path owes the charge (the request was served), so a late reply that
// applied it cancels the debt. Calls made for other purposes (a shadow
// rule's count, a penalty, a refund) are not credited: their failure path
// owes nothing, so what a late reply applied stands.
//
// A call still queued in the store when its caller stops waiting is not
// sent at all (sluice.SendBy): a store that is slow because it is
// overloaded is not sent the calls nobody waits for, and the caller learns
// that the call applied nothing.
//
// The calls run on a pool of worker goroutines, at most maxGraced, which
// is the bound on calls followed at once, in time or late; past it a call
// ends at its deadline, in its caller's goroutine, as a call always did.
// A worker idle for workerIdle ends. The call is its own context during
// the grace (storeCall's Deadline, Done, Err and Value), and a reaper
// closes the contexts of the abandoned calls whose grace has ended, so
// following a call costs its caller no allocation.

// lateGrace is how long a call may answer after its deadline.
const lateGrace = 5 * time.Second

// maxGraced bounds the workers, and so the store calls followed at once:
// as many as a plane's call workers (internal/h2grpc runs 256), so that a
// flood of calls does not double the goroutines it may start.
const maxGraced = 256

// workerIdle is how long a worker waits for a call before it ends.
const workerIdle = 2 * time.Second

// graced is the store as the guard calls it: each call runs on a worker
// and is followed past its deadline (see above). owes says whether the
// caller keeps the ledger of what a failed call leaves owed: a request's
// call, whose failure is answered from the share (Call.Owing), or a
// write-back (flush). Only the ledger's charges and refunds, and a
// request's takes, are credited.
type graced struct {
	c    *Client
	owes bool
}

// storeCall is one graced call: its own copies of the takes and their keys
// (the caller's are views into a buffer it reuses once it has its answer),
// the decisions, the error, and the call's context.
type storeCall struct {
	takes []sluice.Take
	keys  []byte
	out   []sluice.Decision
	err   error
	panic any // a panic of the store's, raised again in the caller
	owes  bool
	state atomic.Int32  // callRunning, callAbandoned or callAnswered
	done  chan struct{} // one send once answered in time

	// The context: values from the caller's, the deadline its plus the
	// grace, done when the reaper closes expired. A pooled call's expired
	// is always open: whoever finds it closed makes it anew.
	parent   context.Context
	sendBy   time.Time // the caller's deadline (see sluice.SendBy)
	deadline time.Time
	expired  chan struct{}
}

const (
	callRunning = iota
	callAbandoned
	callAnswered
)

var storeCalls = sync.Pool{New: func() any {
	return &storeCall{done: make(chan struct{}, 1), expired: make(chan struct{})}
}}

func (c *storeCall) SendBy() time.Time           { return c.sendBy }
func (c *storeCall) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *storeCall) Done() <-chan struct{}       { return c.expired }
func (c *storeCall) Value(key any) any           { return c.parent.Value(key) }
func (c *storeCall) Err() error {
	select {
	case <-c.expired:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// load copies takes, keys included, into the call.
func (c *storeCall) load(takes []sluice.Take, decisions int) {
	n := 0
	for i := range takes {
		n += len(takes[i].Key)
	}
	c.keys = slices.Grow(c.keys[:0], n) // room for all: never grown below, the views stay put
	c.takes = append(c.takes[:0], takes...)
	for i := range c.takes {
		start := len(c.keys)
		c.keys = append(c.keys, c.takes[i].Key...)
		c.takes[i].Key = view.String(c.keys[start:])
	}
	c.out = slices.Grow(c.out[:0], decisions)[:decisions]
	clear(c.out)
	c.err, c.panic = nil, nil
	c.state.Store(callRunning)
}

// release returns a finished call to the pool.
func (c *storeCall) release() {
	clear(c.takes) // no key views or rule names kept alive by the pool
	c.parent = nil
	storeCalls.Put(c)
}

func (g *graced) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	sc := g.c
	deadline, ok := ctx.Deadline()
	if !ok || sc.lateGrace <= 0 {
		return sc.store.Take(ctx, takes, out)
	}
	c := storeCalls.Get().(*storeCall)
	c.load(takes, len(out))
	c.owes, c.parent, c.sendBy, c.deadline = g.owes, ctx, deadline, deadline.Add(sc.lateGrace)
	if !sc.workers.dispatch(sc, c) {
		c.release()
		return sc.store.Take(ctx, takes, out) // maxGraced calls are out
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		sc.reaper.add(c) // before the caller lets go, so the worker finds it there
		if c.state.CompareAndSwap(callRunning, callAbandoned) {
			return ctx.Err()
		}
		sc.reaper.remove(c)
		<-c.done // the reply came as the deadline passed: it is in time
	}
	copy(out, c.out)
	err, p := c.err, c.panic
	c.release()
	if p != nil {
		panic(p) // where the caller's recovery (a request's boundary) sees it
	}
	return err
}

// serve runs a call on a worker and hands it back to its caller, or, if
// the caller answered without it, settles its late reply.
func (sc *Client) serve(c *storeCall) {
	c.run(sc.store)
	if c.state.CompareAndSwap(callRunning, callAnswered) {
		c.done <- struct{}{}
		return
	}
	sc.reaper.remove(c)
	sc.lateReply(c)
	c.release()
}

// errStorePanicked is a late call's error when the store panicked.
var errStorePanicked = errors.New("engine: the store panicked")

// run makes the call, catching a panic of the store's: raised on a worker
// it would end the process, not the request.
func (c *storeCall) run(s sluice.Store) {
	defer func() {
		if v := recover(); v != nil {
			c.err, c.panic = errStorePanicked, v
		}
	}()
	c.err = s.Take(c, c.takes, c.out)
}

// workers runs graced calls. Their number follows the calls in flight: a
// call goes to an idle worker if there is one, and only otherwise starts a
// new one. A worker counts itself idle before it waits for work, and a
// dispatcher claims an idle worker (idle - 1) before handing it a call, so
// a worker just finishing is reused, not doubled by a new one; a worker
// whose wait times out must claim itself the same way to end, and if a
// dispatcher claimed it first, it takes the call on its way.
type workers struct {
	n    atomic.Int64    // running
	idle atomic.Int64    // waiting for work, not claimed
	work chan *storeCall // unbuffered
}

// dispatch hands c to an idle worker, or starts one; false when maxGraced
// workers are busy.
func (w *workers) dispatch(sc *Client, c *storeCall) bool {
	for {
		k := w.idle.Load()
		if k == 0 {
			break
		}
		if w.idle.CompareAndSwap(k, k-1) {
			w.work <- c // a claimed worker is waiting, or about to
			return true
		}
	}
	if w.n.Add(1) > maxGraced {
		w.n.Add(-1)
		return false
	}
	go w.run(sc, c)
	return true
}

func (w *workers) run(sc *Client, c *storeCall) {
	defer w.n.Add(-1)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		sc.serve(c)
		idle.Reset(workerIdle)
		w.idle.Add(1)
		select {
		case c = <-w.work:
			continue
		case <-idle.C:
		}
		for { // time to go, unless claimed meanwhile
			k := w.idle.Load()
			if k == 0 {
				c = <-w.work
				break
			}
			if w.idle.CompareAndSwap(k, k-1) {
				return
			}
		}
	}
}

// reaper ends the grace of abandoned calls: every 100 ms, while some are
// out, it closes the context of those past their deadline.
type reaper struct {
	mu      sync.Mutex
	calls   map[*storeCall]struct{}
	running bool
}

func (r *reaper) add(c *storeCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[*storeCall]struct{}{}
	}
	r.calls[c] = struct{}{}
	if !r.running {
		r.running = true
		go r.run()
	}
}

// remove takes c off the reaper; if its grace had ended, its context is
// made anew for the next call.
func (r *reaper) remove(c *storeCall) {
	r.mu.Lock()
	_, out := r.calls[c]
	delete(r.calls, c)
	r.mu.Unlock()
	if !out {
		c.expired = make(chan struct{})
	}
}

func (r *reaper) run() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for now := range tick.C {
		r.mu.Lock()
		for c := range r.calls {
			if now.After(c.deadline) {
				close(c.expired)
				delete(r.calls, c)
			}
		}
		if len(r.calls) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// lateReply credits what a call answered after its deadline counted in the
// store (see above).
func (sc *Client) lateReply(c *storeCall) {
	switch {
	case errors.Is(c.err, sluice.ErrNotSent):
		sc.owed.lateUnsent.Add(1) // applied nothing: the ledger is right
		return
	case c.err != nil:
		sc.owed.lateLost.Add(1)
		return
	}
	sc.owed.lateAnswered.Add(1)
	admitted := true // every take that counts was admitted, so all counted
	for i := range c.takes {
		if tk := &c.takes[i]; consumes(tk) && !c.out[i].Allowed {
			admitted = false
		}
	}
	now := time.Now()
	for i := range c.takes {
		tk := &c.takes[i]
		switch {
		case tk.Charge, c.owes && tk.Cost < 0:
			// A debt (a charge) or a credit (a refund) from the ledger:
			// applied, so what the failed call owed again is cancelled.
			sc.owed.owe(tk.Rule, tk.Key, tk.Limit, -tk.Cost, now, false)
		case !c.owes || !admitted || !consumes(tk) || tk.Hold != "":
		case sc.owesRule(tk.Rule):
			sc.owed.owe(tk.Rule, tk.Key, tk.Limit, -tk.Cost, now, false)
		}
	}
	sc.owed.kick(sc)
}

// consumes reports whether a take consumes its cost if its call is admitted.
func consumes(tk *sluice.Take) bool {
	return tk.Cost > 0 && !tk.DryRun && !tk.Charge && !tk.Settle
}

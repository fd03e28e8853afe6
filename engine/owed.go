package engine

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// What a gateway admits on its own while the store does not answer (a rule
// failing open within its share, see failed) is owed to the store. Unless
// the store is told, it admits its whole limit again once it answers, or a
// promoted replica does: a failover admits each degraded gateway's share on
// top of the limit. So each degraded admission is written down here and
// charged to the store once it answers (sluice.Take.Charge: beyond the
// limit if need be, a debt that later takes wait out), and the count over a
// whole window is:
//
//	admitted <= limit + what the store lost (a replica's replication lag)
//	               + what is owed and not yet written back
//
// where the last term is bounded by the shares admitted in the window in
// which the store came back: a debt written back makes the key wait it out,
// so what was admitted early in a window is paid for within it.
//
// The ledger is bounded: at most maxOwed keys (rule and key) are owed at
// once, the units of one key adding up; past the bound an admission is
// counted as unwritten (sluice_degraded_unwritten_total{reason="overflow"}).
// A debt whose limit's period has passed since its first admission is
// dropped unwritten ({reason="expired"}): by then the store's own count of
// that time has emptied too, and charging it would refuse the key for
// units already paid off.
//
// A store call that misses its deadline may still be applied by the store;
// its degraded admission is then counted twice (once by the call, once by
// the charge): never more than the limit, sometimes less.
//
// Writing back needs no goroutine of its own: a call that succeeds while
// something is owed starts one flush (kick), which charges in batches of
// one store node each and stops at the first failure.
type owed struct {
	mu      sync.Mutex
	debts   map[owedKey]*debt
	pending atomic.Bool  // debts is not empty
	flowing atomic.Bool  // a flush runs
	last    atomic.Int64 // when the last flush started, ns

	written, expired, overflow, shutdown atomic.Int64 // units
}

// maxOwed bounds the keys owed at once.
const maxOwed = 1 << 16

// flushEvery spaces flushes out: a store that answers while many keys are
// owed is charged in one go, not once per successful call.
const flushEvery = 100 * time.Millisecond

type owedKey struct{ rule, key string }

type debt struct {
	limit sluice.Limit
	units int64
	first time.Time
}

// add owes units of key under rule, counted under limit in the store.
func (o *owed) add(rule, key string, limit sluice.Limit, units int64, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.debts == nil {
		o.debts = map[owedKey]*debt{}
	}
	k := owedKey{rule, key}
	d, ok := o.debts[k]
	switch {
	case ok && d.limit == limit:
		d.units += units
		return
	case ok: // the rule changed (a reload): a new debt under the new limit
	case len(o.debts) >= maxOwed:
		o.overflow.Add(units)
		return
	}
	k.key = strings.Clone(key) // keys are views into a reused buffer
	o.debts[k] = &debt{limit: limit, units: units, first: now}
	o.pending.Store(true)
}

// kick starts a flush if something is owed and none ran lately.
func (o *owed) kick(e *Engine) {
	if !o.pending.Load() || o.flowing.Load() {
		return
	}
	now := time.Now().UnixNano()
	if last := o.last.Load(); now-last < int64(flushEvery) || !o.last.CompareAndSwap(last, now) {
		return
	}
	if !o.flowing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer o.flowing.Store(false)
		o.flush(context.Background(), e, time.Now())
	}()
}

// flush charges what is owed to the store, a batch per store node, until
// a call fails. Debts past their period are dropped. The debts being
// charged leave the ledger before their call and come back only if it
// fails: a request for one of their keys meanwhile (callOwing) finds
// nothing to charge, so no debt is charged twice.
func (o *owed) flush(ctx context.Context, e *Engine, now time.Time) {
	batches := map[string][]sluice.Take{}
	firsts := map[string][]time.Time{}
	o.mu.Lock()
	for k, d := range o.debts {
		delete(o.debts, k)
		if now.Sub(d.first) >= d.limit.Period {
			o.expired.Add(d.units)
			continue
		}
		tk := sluice.Take{Rule: k.rule, Key: k.key, Limit: d.limit, Cost: d.units, Charge: true}
		part := ""
		if e.parts != nil {
			part = e.parts.Partition(&tk)
		}
		batches[part] = append(batches[part], tk)
		firsts[part] = append(firsts[part], d.first)
	}
	o.pending.Store(len(o.debts) > 0)
	o.mu.Unlock()
	failed := false
	for part, takes := range batches {
		for start := 0; start < len(takes); start += maxChargeBatch {
			end := min(start+maxChargeBatch, len(takes))
			if !failed {
				out := make([]sluice.Decision, end-start)
				if err := e.call(ctx, takes[start:end], out); err == nil {
					for _, tk := range takes[start:end] {
						o.written.Add(tk.Cost)
					}
					continue
				}
				failed = true // the store is still away: the rest waits for the next kick
			}
			o.restore(takes[start:end], firsts[part][start:end])
		}
	}
}

// maxChargeBatch bounds the charges of one store call.
const maxChargeBatch = 64

// OwedStats are the units admitted while the store did not answer: still
// owed to it, written back, and dropped unwritten because their period
// passed first or the ledger was full.
type OwedStats struct {
	Owed, Written, Expired, Overflow, Shutdown int64
}

// Owed returns the ledger of degraded admissions (see owed).
func (e *Engine) Owed() OwedStats {
	o := &e.owed
	o.mu.Lock()
	var n int64
	for _, d := range o.debts {
		n += d.units
	}
	o.mu.Unlock()
	return OwedStats{Owed: n, Written: o.written.Load(), Expired: o.expired.Load(), Overflow: o.overflow.Load(), Shutdown: o.shutdown.Load()}
}

// StoreAnswered tells the engine that the store answered a call made
// outside it (the membership heartbeat): what is owed is written back now,
// not only once a request of this gateway reaches the store. A gateway that
// serves no traffic after an outage still pays what it owes.
func (e *Engine) StoreAnswered() {
	if !e.answering.Load() {
		e.answering.Store(true)
	}
	e.owed.kick(e)
}

// WriteBackOwed writes back what is owed, for a gateway that stops: it
// waits for a flush under way, flushes once more within ctx, and drops
// what is still owed then, counted as unwritten (reason "shutdown"). It
// returns the units written and dropped.
func (e *Engine) WriteBackOwed(ctx context.Context) (written, dropped int64) {
	before := e.owed.written.Load()
	for !e.owed.flowing.CompareAndSwap(false, true) {
		select {
		case <-ctx.Done():
			return 0, 0
		case <-time.After(10 * time.Millisecond):
		}
	}
	defer e.owed.flowing.Store(false)
	e.owed.flush(ctx, e, time.Now())
	o := &e.owed
	o.mu.Lock()
	for k, d := range o.debts {
		dropped += d.units
		delete(o.debts, k)
	}
	o.pending.Store(false)
	o.mu.Unlock()
	o.shutdown.Add(dropped)
	return o.written.Load() - before, dropped
}

// callOwing is call for a request's takes, with the debts of their keys
// charged first in the same atomic store call: a key asked for again once
// the store answers pays what it owes before it is decided, so the store
// never admits it on a count that misses its degraded admissions, even for
// the moment before a flush would charge them. With nothing owed it is
// call, at the cost of one atomic load.
//
// Debts ride only on calls made while the store answers (its last call
// succeeded). A call that misses its deadline may still be applied once the
// store wakes; were each such call to carry a key's debt, a hung store
// would apply that debt once for every call queued while it hung.
func (e *Engine) callOwing(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	if !e.owed.pending.Load() || !e.answering.Load() {
		return e.call(ctx, takes, out)
	}
	charges, firsts := e.owed.claim(takes)
	if len(charges) == 0 {
		return e.call(ctx, takes, out)
	}
	all := append(charges, takes...)
	decs := make([]sluice.Decision, len(all))
	if err := e.call(ctx, all, decs); err != nil {
		e.owed.restore(charges, firsts)
		return err
	}
	copy(out, decs[len(charges):])
	var n int64
	for _, c := range charges {
		n += c.Cost
	}
	e.owed.written.Add(n)
	return nil
}

// claim removes and returns, as charges, the debts of the keys of takes
// that take units, and when each was first owed.
func (o *owed) claim(takes []sluice.Take) ([]sluice.Take, []time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var charges []sluice.Take
	var firsts []time.Time
	for i := range takes {
		tk := &takes[i]
		if tk.Cost <= 0 || tk.DryRun || tk.Charge {
			continue
		}
		k := owedKey{tk.Rule, tk.Key}
		d, ok := o.debts[k]
		if !ok || d.limit != tk.Limit {
			continue
		}
		delete(o.debts, k)
		charges = append(charges, sluice.Take{Rule: k.rule, Key: k.key, Limit: d.limit, Cost: d.units, Charge: true})
		firsts = append(firsts, d.first)
	}
	o.pending.Store(len(o.debts) > 0)
	return charges, firsts
}

// restore owes again the charges of a call that failed.
func (o *owed) restore(charges []sluice.Take, firsts []time.Time) {
	for i, c := range charges {
		o.add(c.Rule, c.Key, c.Limit, c.Cost, firsts[i])
	}
}

package storecall

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
)

// What a gateway admits on its own while the store does not answer (a rule
// failing open within its share: the engine's failed, and Owe) is owed to
// the store. Unless
// the store is told, it admits its whole limit again once it answers, or a
// promoted replica does: a failover admits each degraded gateway's share on
// top of the limit. So each degraded admission is written down here and
// charged to the store once it answers (sluice.Take.Charge: beyond the
// limit if need be, a debt that later takes wait out).
//
// The invariant that keeps the store's count whole: a key is never decided
// by the store while a debt of it is neither charged nor in the same call.
// A request for a key that owes carries the debt in its own atomic call
// (Call.Owing, takeWithDebts); a write-back (flush) takes a batch of debts off the ledger
// into flight, and a request for a key in flight waits for that batch to
// land before it calls the store. So the first request after an outage, or
// one that comes while a write-back runs, is decided on a count that holds
// the key's degraded admissions.
//
// A call that carries debts and fails is undone: its debts are owed again,
// never dropped, since a debt lost is a window admitted twice. A call that
// missed its deadline may still be applied, though (a hung Redis applies
// the calls it queued when it wakes), so the debts it carried come back
// marked late, and a late debt does not ride on calls made while the store
// is not answering (its last call failed): a store waking from a hang
// applies it once, not once per call queued meanwhile. Once the store
// answers, late debts ride and are written back again; a late call whose
// reply comes within its grace credits what it applied (late.go), so a debt
// the waking store had applied is refunded, and only one whose reply was
// lost is charged twice (under, never over).
//
// The ledger is bounded: at most MaxOwedKeys keys (rule and key) are owed at
// once, the units of one key adding up; past the bound an admission is
// counted as unwritten (sluice_degraded_unwritten_total{reason="overflow"}).
// A debt whose limit's period has passed since its first admission is
// dropped unwritten ({reason="expired"}): by then the store's own count of
// that time has emptied too, and charging it would refuse the key for
// units already paid off.
//
// Writing back needs no goroutine of its own: a call that succeeds while
// something is owed starts one flush (kick), which charges in batches of
// one store node each and stops at the first failure; so does a heartbeat
// the store answers (Client.Answered).
type owed struct {
	mu       sync.Mutex
	debts    map[owedKey]*debt
	inflight map[owedKey]*flight // debts a write-back is charging now
	pending  atomic.Bool         // debts or inflight is not empty
	flowing  atomic.Bool         // a flush runs
	last     atomic.Int64        // when the last flush started, ns
	every    time.Duration       // at most one flush started in it (Options.WriteBackEvery)

	written, expired, overflow, shutdown atomic.Int64 // units
	refunded, creditsLost                atomic.Int64 // units (see late.go)
	lateAnswered, lateLost, lateUnsent   atomic.Int64 // calls (see late.go)
}

// MaxOwedKeys bounds the keys (a rule and a key) owed at once: past it
// an admission made without the store is counted unwritten.
const MaxOwedKeys = 1 << 16

// flushEvery is the default of Options.WriteBackEvery: a store that
// answers while many keys are owed is charged in one go, not once per
// successful call.
const flushEvery = 100 * time.Millisecond

// maxChargeBatch bounds the charges of one store call.
const maxChargeBatch = 64

type owedKey struct{ rule, key string }

// A debt's units are negative when the store counted more than this
// gateway admitted (a late reply's credit, see late.go): the write-back
// gives them back.
type debt struct {
	limit sluice.Limit
	units int64
	first time.Time
	late  bool // carried by a call that missed its deadline (see owed)
}

// flight is a batch of debts being charged; landed is closed once its call
// has returned and its debts are written or owed again.
type flight struct {
	units  int64
	landed chan struct{}
}

// Owe records units of key under rule, counted under limit in the store,
// as admitted without the store: they are charged to it once it answers,
// carried by the key's next call or written back (see owed).
func (c *Client) Owe(rule, key string, limit sluice.Limit, units int64) {
	c.owed.owe(rule, key, limit, units, time.Now(), false)
}

// owe records a debt (a credit if units < 0), late if its call missed its
// deadline (see owed).
func (o *owed) owe(rule, key string, limit sluice.Limit, units int64, now time.Time, late bool) {
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
		d.late = d.late || late
		if d.units == 0 { // a debt and its credit (see late.go)
			delete(o.debts, k)
			o.notePending()
		}
		return
	case ok: // the rule changed (a reload): a new debt under the new limit
	case len(o.debts) >= MaxOwedKeys && units < 0:
		o.creditsLost.Add(-units) // the store keeps them: under, never over
		return
	case len(o.debts) >= MaxOwedKeys:
		o.overflow.Add(units)
		return
	}
	k.key = strings.Clone(key) // keys are views into a reused buffer
	o.debts[k] = &debt{limit: limit, units: units, first: now, late: late}
	o.pending.Store(true)
}

// notePending records whether anything is owed or in flight, for kick.
// o.mu is held.
func (o *owed) notePending() { o.pending.Store(len(o.debts) > 0 || len(o.inflight) > 0) }

// settle records how a call that carried charges ended: written, or owed
// again (late if the call missed its deadline, see owed).
func (o *owed) settle(err error, charges []sluice.Take, firsts []time.Time) {
	if err == nil {
		for _, c := range charges {
			if c.Cost > 0 {
				o.written.Add(c.Cost)
			} else {
				o.refunded.Add(-c.Cost)
			}
		}
		return
	}
	late := errors.Is(err, context.DeadlineExceeded)
	for i, c := range charges {
		o.owe(c.Rule, c.Key, c.Limit, c.Cost, firsts[i], late)
	}
}

// kick starts a flush if something is owed and none ran lately.
func (o *owed) kick(c *Client) {
	if !o.pending.Load() || o.flowing.Load() || o.every < 0 {
		return
	}
	now := time.Now().UnixNano()
	if last := o.last.Load(); now-last < int64(o.every) || !o.last.CompareAndSwap(last, now) {
		return
	}
	if !o.flowing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer o.flowing.Store(false)
		o.flush(context.Background(), c, time.Now())
	}()
}

// flush charges what is owed to the store, a batch of one store node at a
// time, until a call fails. Debts past their period are dropped. Only the
// batch being charged is in flight: the rest stay owed, for requests of
// their keys to carry.
func (o *owed) flush(ctx context.Context, c *Client, now time.Time) {
	for {
		takes, firsts, landed := o.board(c, now)
		if len(takes) == 0 {
			return
		}
		out := make([]sluice.Decision, len(takes))
		err := c.send(ctx, &c.owingCalls, 0, takes, out) // its late reply settles what it carried
		o.land(takes, landed)
		o.settle(err, takes, firsts)
		close(landed)
		if err != nil {
			return // the store is still away: the rest waits for the next kick
		}
	}
}

// board takes up to maxChargeBatch debts of one store node off the ledger
// into flight, dropping the expired ones it meets.
func (o *owed) board(c *Client, now time.Time) ([]sluice.Take, []time.Time, chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var takes []sluice.Take
	var firsts []time.Time
	part, chosen := "", false
	for k, d := range o.debts {
		if now.Sub(d.first) >= d.limit.Period {
			o.expired.Add(max(d.units, 0)) // a credit's units have emptied from the store too
			delete(o.debts, k)
			continue
		}
		// A credit goes back as a refund, which the store applies
		// whatever the other takes of the call decide, as a charge.
		tk := sluice.Take{Rule: k.rule, Key: k.key, Limit: d.limit, Cost: d.units, Charge: d.units > 0}
		if c.parts != nil {
			p := c.parts.Partition(&tk)
			if chosen && p != part {
				continue
			}
			part, chosen = p, true
		}
		takes = append(takes, tk)
		firsts = append(firsts, d.first)
		if len(takes) == maxChargeBatch {
			break
		}
	}
	if len(takes) == 0 {
		o.pending.Store(len(o.inflight) > 0)
		return nil, nil, nil
	}
	if o.inflight == nil {
		o.inflight = map[owedKey]*flight{}
	}
	landed := make(chan struct{})
	for _, tk := range takes {
		k := owedKey{tk.Rule, tk.Key}
		delete(o.debts, k)
		o.inflight[k] = &flight{units: tk.Cost, landed: landed}
	}
	return takes, firsts, landed
}

// land takes a batch out of flight.
func (o *owed) land(takes []sluice.Take, landed chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, tk := range takes {
		k := owedKey{tk.Rule, tk.Key}
		if f := o.inflight[k]; f != nil && f.landed == landed {
			delete(o.inflight, k)
		}
	}
	o.notePending()
}

// OwedStats are the units admitted while the store did not answer: still
// owed to it (in flight included), written back, and dropped unwritten
// because their period passed first, the ledger was full or the gateway
// stopped. Beside them, what late replies told (see late.go): the calls
// answered after their deadline, those whose reply never came and those
// the store never sent, and the
// units the store counted that this gateway did not admit: to give back
// (Credit), given back (Refunded), and kept by the store because the
// ledger was full (CreditsLost).
type OwedStats struct {
	Owed, Written, Expired, Overflow, Shutdown int64
	Credit, Refunded, CreditsLost              int64
	LateAnswered, LateLost, LateUnsent         int64
}

// Owed returns the ledger of degraded admissions (see owed).
func (c *Client) Owed() OwedStats {
	o := &c.owed
	var st OwedStats
	add := func(units int64) {
		st.Owed += max(units, 0)
		st.Credit += max(-units, 0)
	}
	o.mu.Lock()
	for _, d := range o.debts {
		add(d.units)
	}
	for _, f := range o.inflight {
		add(f.units)
	}
	o.mu.Unlock()
	st.Written, st.Expired, st.Overflow, st.Shutdown = o.written.Load(), o.expired.Load(), o.overflow.Load(), o.shutdown.Load()
	st.Refunded, st.CreditsLost = o.refunded.Load(), o.creditsLost.Load()
	st.LateAnswered, st.LateLost, st.LateUnsent = o.lateAnswered.Load(), o.lateLost.Load(), o.lateUnsent.Load()
	return st
}

// Answered tells the client that the store answered a call made outside
// it (the membership heartbeat): what is owed is written back now, not
// only once a request of this gateway reaches the store. A gateway that
// serves no traffic after an outage still pays what it owes.
func (c *Client) Answered() { c.owed.kick(c) }

// Flush writes back what is owed now, a batch of one store node at a time,
// until nothing is owed or a call fails; a write-back under way is waited
// for first. The client writes back by itself whenever the store answers
// (at most once per Options.WriteBackEvery): Flush is for a caller that
// must know it is done.
func (c *Client) Flush(ctx context.Context) {
	for !c.owed.flowing.CompareAndSwap(false, true) {
		if ctx.Err() != nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
	defer c.owed.flowing.Store(false)
	c.owed.flush(ctx, c, time.Now())
}

// WriteBack writes back what is owed, for a gateway that stops: it
// waits for a write-back under way, then tries again every 100 ms (a
// breaker opened by the outage lets a call through within a second) until
// nothing is owed or ctx is done. What is still owed then, in flight
// included, is dropped and counted as unwritten (reason "shutdown"). It
// returns the units written and dropped.
func (c *Client) WriteBack(ctx context.Context) (written, dropped int64) {
	o := &c.owed
	before := o.written.Load()
	for o.pending.Load() {
		if o.flowing.CompareAndSwap(false, true) {
			o.flush(ctx, c, time.Now())
			o.flowing.Store(false)
		}
		if !o.pending.Load() {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	o.mu.Lock()
	for k, d := range o.debts {
		dropped += max(d.units, 0) // a credit dropped is a refund the store misses: under
		delete(o.debts, k)
	}
	for k, f := range o.inflight {
		dropped += max(f.units, 0)
		delete(o.inflight, k)
	}
	o.pending.Store(false)
	o.mu.Unlock()
	o.shutdown.Add(dropped)
	return o.written.Load() - before, dropped
}

// takeWithDebts is a call of takes with the debts of their keys charged
// first in the same atomic store call: a key asked for again once the
// store answers pays what it owes before it is decided, so the store never
// admits it on a count that misses its degraded admissions. A key whose
// debt a write-back is charging waits for that call to land first.
func (c *Client) takeWithDebts(ctx context.Context, wait time.Duration, takes []sluice.Take, out []sluice.Decision) error {
	charges, firsts := c.owed.claim(takes, c.answering.Load())
	if len(charges) == 0 {
		return c.send(ctx, &c.owingCalls, wait, takes, out)
	}
	all := append(charges, takes...)
	decs := make([]sluice.Decision, len(all))
	err := c.send(ctx, &c.owingCalls, wait, all, decs)
	c.owed.settle(err, charges, firsts)
	if err != nil {
		return err
	}
	copy(out, decs[len(charges):])
	return nil
}

// claim removes and returns, as charges, the debts of the keys of takes
// that are neither refunds nor dry runs (a take of cost 0 carries its key's
// debt too), and when each was first owed. A key in flight is waited
// for, then looked at again: its write-back may have failed and left it
// owed. The wait is bounded by the write-back's own call, which has the
// store's deadline; a request whose client left waits too, since its call
// goes on without it. A late debt stays while the store is not answering.
func (o *owed) claim(takes []sluice.Take, answering bool) ([]sluice.Take, []time.Time) {
	for {
		o.mu.Lock()
		var wait chan struct{}
		var charges []sluice.Take
		var firsts []time.Time
		for i := range takes {
			tk := &takes[i]
			if tk.Cost < 0 || tk.DryRun || tk.Charge {
				continue
			}
			k := owedKey{tk.Rule, tk.Key}
			if f := o.inflight[k]; f != nil {
				wait = f.landed
				break
			}
			d, ok := o.debts[k]
			if !ok || d.limit != tk.Limit || d.units < 0 || (d.late && !answering) {
				continue
			}
			charges = append(charges, sluice.Take{Rule: k.rule, Key: k.key, Limit: d.limit, Cost: d.units, Charge: true})
			firsts = append(firsts, d.first)
		}
		if wait == nil {
			for _, c := range charges {
				delete(o.debts, owedKey{c.Rule, c.Key})
			}
			o.notePending()
			o.mu.Unlock()
			return charges, firsts
		}
		o.mu.Unlock()
		<-wait
	}
}

package engine

import (
	"context"
	"math"

	"github.com/sluice-rl/sluice"
)

// A rule's answer when its store call fails: failMode closed refuses;
// open admits within this gateway's share of what the store last said was
// left (follow keeps it, fallbackTake spends it), and what it admits is
// owed to the store (storecall.Client.Owe), which it is charged once it
// answers.

// follow keeps a fail-open rule's share of key in the fallback store at
// what the store last said was left of it: after each store decision of a
// take that counts, the fallback's level for the key is set to the
// decision's remaining (its level, above a tier's floor: Remaining +
// Floor), in raw units under the rule's whole limit. A degraded answer
// then costs n units per unit (see degradedLimit), so this gateway admits
// at most its part, (left + refill since)/n, and the parts of n gateways
// add up to what the store had left, whatever the load balancer sent each
// one. The bound that remains is written down in docs/redis.md ("The
// bound over a window"): a gateway's last look is as old as its last
// reply, so what the store admitted for the others since then counts 1/n.
//
// Setting a level is a peek and a charge or refund of the difference, not
// one atomic step: a reply that races another for the same key on this
// gateway may leave the level off by one reply's difference until the
// next reply sets it again.
//
// A rule with its own fallback limit keeps that limit per gateway, less
// what this gateway admitted through the store (each admitted take is
// charged there too). The take and decision live in res: arrays on the
// stack would escape through the store's interface, an allocation per
// take.
func (e *Engine) follow(ctx context.Context, res *Result, r *rule, l sluice.Limit, tk *sluice.Take, d *sluice.Decision) {
	if !e.client.Guarded() || e.fallback == nil || r.FailClosed {
		return
	}
	fb := &res.mirrorTake[0]
	if r.FallbackSet {
		if d.Allowed && tk.Cost > 0 {
			*fb = sluice.Take{Rule: r.fallbackID, Key: tk.Key, Limit: r.Fallback, Cost: tk.Cost, Charge: tk.Charge}
			e.fallback.Take(ctx, res.mirrorTake[:], res.mirrorOut[:])
		}
		return
	}
	left := d.Remaining
	if tk.Floor > 0 { // saturating: a floor is at most the capacity
		left = min(left, math.MaxInt64-tk.Floor) + tk.Floor
	}
	*fb = sluice.Take{Rule: r.fallbackID, Key: tk.Key, Limit: l} // a peek
	if e.fallback.Take(ctx, res.mirrorTake[:], res.mirrorOut[:]) != nil {
		return
	}
	switch diff := res.mirrorOut[0].Remaining - left; {
	case diff > 0:
		fb.Cost, fb.Charge = diff, true
	case diff < 0:
		fb.Cost = diff // a refund: never fuller than a fresh key
	default:
		return
	}
	e.fallback.Take(ctx, res.mirrorTake[:], res.mirrorOut[:])
}

// failed answers the enforced rules of a request whose store call failed:
// fail-closed rules reject, fail-open rules fall back to their per-node limit.
func (e *Engine) failed(ctx context.Context, res *Result, err error, dry bool) {
	res.StoreError = err
	for j, tk := range res.takes {
		m := &res.matched[res.idx[j]]
		d, closed := e.failMode(ctx, m.r, tk.Limit, tk)
		if closed {
			st := res.add(m.r, m.key, d)
			st.FailedClosed = true
			continue
		}
		if m.r.Adaptive {
			unscale(&d, m.r, res.factor)
		}
		st := res.add(m.r, m.key, d)
		st.FailedOpen = true
		if len(m.r.CountOn) > 0 && d.Allowed && !dry {
			st.charge = tk.Cost // charged after the response, as when the store answers
		}
	}
}

// failMode answers one take whose store call failed, by its rule's fail
// mode: closed refuses it (ReasonUnavailable, retry when the breaker next
// lets a probe through); open takes it from this gateway's share
// (fallbackTake). Every door (Check, CheckDescriptors, a countOn charge)
// answers a failed store this way.
func (e *Engine) failMode(ctx context.Context, r *rule, l sluice.Limit, tk sluice.Take) (d sluice.Decision, closed bool) {
	if r.FailClosed {
		return sluice.Decision{Rule: r.ID, Limit: r.Limit, Reason: sluice.ReasonUnavailable, RetryAfter: e.client.RetryAfterFailure()}, true
	}
	return e.fallbackTake(ctx, r, l, tk), false
}

// fallbackTake decides a fail-open take of rule r (counted under limit l)
// in the fallback store, within the rule's degraded limit. Without a
// fallback store, or if it fails, the take is admitted.
func (e *Engine) fallbackTake(ctx context.Context, r *rule, l sluice.Limit, tk sluice.Take) sluice.Decision {
	d := sluice.Decision{Rule: r.ID, Limit: l, Allowed: true}
	if e.fallback == nil {
		return d
	}
	var out [1]sluice.Decision
	dl, n := e.degradedLimit(r, l)
	fb := [1]sluice.Take{{Rule: r.fallbackID, Key: tk.Key, Limit: dl, Cost: mulCost(tk.Cost, n), DryRun: tk.DryRun, Charge: tk.Charge,
		Floor: mulCost(degradedFloor(tk.Floor, dl, l), n)}}
	if e.fallback.Take(ctx, fb[:], out[:]) == nil {
		d = out[0]
		d.Rule, d.Limit, d.Remaining = r.ID, l, d.Remaining/n
	}
	if d.Allowed && tk.Cost > 0 && !tk.DryRun && writesBack(r) {
		e.client.Owe(r.ID, tk.Key, l, tk.Cost)
	}
	return d
}

// degradedFloor is a tier's floor (Take.Floor, in units of l) in the
// degraded limit dl: the same share of its capacity, rounded up, so that
// the tiers above keep their part of a gateway's share while the store
// fails, as they keep it of the store's count.
func degradedFloor(floor int64, dl, l sluice.Limit) int64 {
	if floor <= 0 || dl == l {
		return floor
	}
	return min(dl.Capacity(), int64(math.Ceil(float64(floor)*float64(dl.Capacity())/float64(l.Capacity()))))
}

// writesBack reports whether what a rule admits while the store fails is
// owed to the store (see owed): for the rules whose count lives there.
func writesBack(r *rule) bool {
	switch r.Sync.Mode {
	case sluice.SyncExact, sluice.SyncLease, sluice.SyncAuto:
		return true
	}
	return false
}

// degradedLimit is how a fail-open rule counts in the fallback store while
// the store fails: under its own fallback limit if it has one (cost as
// is), else under its limit with every unit counted n times, n being the
// gateways sharing the store. Counting n units per unit under the whole
// limit admits the gateway's share, floor(L/n) at once and a rate of 1/n,
// as a limit of L/n would; but its state is the same whatever n is, so
// what the gateway admitted through the store (mirrored here) still counts
// when the number of gateways changes (a limit of L/n would start afresh
// with each new n, and admit a new share on top), and a limit below n
// gives each gateway no unit rather than one.
func (e *Engine) degradedLimit(r *rule, l sluice.Limit) (sluice.Limit, int64) {
	if r.FallbackSet {
		return r.Fallback, 1
	}
	n := 1
	if e.gateways != nil {
		n = max(e.gateways(), 1)
	}
	return l, int64(n)
}

package memory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// DefaultMaxHolds is the default bound on the reservations the store keeps
// open at once (see sluice.Take.Hold and WithMaxHolds).
const DefaultMaxHolds = 1 << 18

// holds are the open reservations: for each (rule, key, id), the units
// reserved and the deadline. They sit beside the tables, not in them, so
// the lock-free takes stay as they are.
//
// Settling is exact because closing a reservation is one delete under the
// holds' mutex, which only one settle of an id can win; the winner then
// applies the difference to the key as one refund or one charge, which are
// single atomic steps of their own (a compare-and-swap, or a shard lock) and
// commute with every concurrent take: a key charged c and refunded r ends
// as if the estimate had been c - r larger, whatever ran in between. A
// reservation past its deadline is closed for good and its estimate stands.
//
// The holds are bounded: at the bound the expired ones are dropped, and if
// the live ones alone fill it, a new reservation takes its estimate without
// being recorded (it settles at its estimate, the strict side) and is
// counted in Stats.
type holds struct {
	mu      sync.Mutex
	m       map[holdKey]hold
	max     int
	dropped atomic.Uint64
}

type holdKey struct{ rule, key, id string }

type hold struct {
	units int64
	until int64 // open while now < until
}

func newHolds(max int) *holds { return &holds{m: map[holdKey]hold{}, max: max} }

// open records units reserved for k until until.
func (h *holds) open(k holdKey, units, until, now int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.m[k]; !ok && len(h.m) >= h.max {
		h.expire(now)
		if len(h.m) >= h.max {
			h.dropped.Add(1)
			return
		}
	}
	// Clone: the caller's strings may point into reused buffers.
	k = holdKey{strings.Clone(k.rule), strings.Clone(k.key), strings.Clone(k.id)}
	h.m[k] = hold{units: units, until: until}
}

// close removes k's reservation and returns its units, if it is still
// open at now.
func (h *holds) close(k holdKey, now int64) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.m[k]
	if !ok {
		return 0, false
	}
	delete(h.m, k)
	return r.units, now < r.until
}

// expire drops the reservations past their deadline. Call with mu held.
func (h *holds) expire(now int64) {
	for k, r := range h.m {
		if now >= r.until {
			delete(h.m, k)
		}
	}
}

func (h *holds) sweep(now int64) {
	h.mu.Lock()
	h.expire(now)
	h.mu.Unlock()
}

func (h *holds) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}

// settle settles tk (a take with Settle set) at now: it closes the
// reservation and applies the difference between tk.Cost and the units
// reserved.
func (s *Store) settle(t anyTable, tk *sluice.Take, now int64, d *sluice.Decision) {
	units, ok := s.holds.close(holdKey{tk.Rule, tk.Key, tk.Hold}, now)
	var r algo.Result
	switch delta := tk.Cost - units; {
	case !ok:
		r = t.take(tk.Key, now, 0, false)
		r.Allowed, r.Reason = false, sluice.ReasonNoReservation
	case delta > 0:
		r = t.chargeKey(tk.Key, now, delta)
	default: // a refund, or a peek for an estimate that was right
		r = t.take(tk.Key, now, delta, false)
	}
	decide(d, t.meta(), &r)
}

// takeHolding is Take for calls that open, settle or cancel reservations:
// the settles first, each on its own (they apply whatever the others
// decide), then the other takes as one atomic step, then the reservations
// of an admitted call are opened.
func (s *Store) takeHolding(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	now := s.clock.Now()
	for i := range takes {
		if len(takes[i].Hold) > sluice.MaxHoldLen {
			return fmt.Errorf("memory: rule %q: reservation id longer than %d bytes", takes[i].Rule, sluice.MaxHoldLen)
		}
	}
	var rest []sluice.Take
	var idx []int
	for i := range takes {
		tk := &takes[i]
		if tk.Hold != "" && tk.Settle {
			t, err := s.table(tk.Rule, tk.Limit)
			if err != nil {
				return err
			}
			s.settle(t, tk, now, &out[i])
			continue
		}
		if tk.Hold != "" && tk.Cost < 0 { // giving back a reservation cancels it
			s.holds.close(holdKey{tk.Rule, tk.Key, tk.Hold}, now)
		}
		rest, idx = append(rest, *tk), append(idx, i)
	}
	if len(rest) == 0 {
		return nil
	}
	decs := make([]sluice.Decision, len(rest))
	if err := s.take(ctx, rest, decs); err != nil {
		return err
	}
	admitted := true
	for j, i := range idx {
		out[i] = decs[j]
		admitted = admitted && (decs[j].Allowed || rest[j].Cost <= 0)
	}
	if !admitted {
		return nil
	}
	for _, tk := range rest {
		if tk.Hold != "" && tk.Cost > 0 && !tk.DryRun && tk.HoldFor > 0 {
			s.holds.open(holdKey{tk.Rule, tk.Key, tk.Hold}, tk.Cost, now+int64(tk.HoldFor), now)
		}
	}
	return nil
}

package memory

import (
	"container/heap"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
// The holds are bounded, and every operation on them is O(log n) at most,
// full or not: the reservations are also kept in a heap by deadline, so
// making room pops only the ones past their deadline, and finding none
// costs one look at the earliest. A reservation for which there is no room
// is refused before anything is taken (ReasonUnavailable, RetryAfter the
// time until the earliest deadline), and counted: never taken unrecorded,
// so that every reservation the store admits can be settled.
type holds struct {
	mu       sync.Mutex
	m        map[holdKey]*hold
	byExpiry holdHeap
	max      int
	refused  atomic.Uint64
}

type holdKey struct{ rule, key, id string }

type hold struct {
	key   holdKey
	units int64
	until int64 // open while now < until
	index int   // in byExpiry
}

func newHolds(max int) *holds { return &holds{m: map[holdKey]*hold{}, max: max} }

// room makes room for n new reservations at now: it drops those past their
// deadline, earliest first, and reports whether n fit. When they do not, it
// returns how long until the earliest open one ends.
func (h *holds) room(n int, now int64) (bool, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expire(now)
	if len(h.m)+n <= h.max {
		return true, 0
	}
	h.refused.Add(1)
	return false, time.Duration(h.byExpiry[0].until - now)
}

// open records units reserved for k until until.
func (h *holds) open(k holdKey, units, until int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.m[k]; ok { // the same id again: the latest stands
		r.units, r.until = units, until
		heap.Fix(&h.byExpiry, r.index)
		return
	}
	// Clone: the caller's strings may point into reused buffers.
	k = holdKey{strings.Clone(k.rule), strings.Clone(k.key), strings.Clone(k.id)}
	r := &hold{key: k, units: units, until: until}
	h.m[k] = r
	heap.Push(&h.byExpiry, r)
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
	heap.Remove(&h.byExpiry, r.index)
	return r.units, now < r.until
}

// expire drops the reservations past their deadline, earliest first. Call
// with mu held.
func (h *holds) expire(now int64) {
	for len(h.byExpiry) > 0 && now >= h.byExpiry[0].until {
		r := heap.Pop(&h.byExpiry).(*hold)
		delete(h.m, r.key)
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

// holdHeap orders reservations by deadline (container/heap).
type holdHeap []*hold

func (q holdHeap) Len() int           { return len(q) }
func (q holdHeap) Less(i, j int) bool { return q[i].until < q[j].until }
func (q holdHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *holdHeap) Push(x any) {
	r := x.(*hold)
	r.index = len(*q)
	*q = append(*q, r)
}
func (q *holdHeap) Pop() any {
	old := *q
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return r
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
		r.Applied()
		r.Allowed, r.Reason = false, sluice.ReasonNoReservation
	case delta > 0:
		r = t.chargeKey(tk.Key, now, delta)
	default: // a refund, or a peek for an estimate that was right
		r = t.take(tk.Key, now, delta, false)
		r.Applied()
	}
	decide(d, t.meta(), &r)
}

// takeHolding is Take for calls that open, settle or cancel reservations,
// or charge: the settles and charges first, each on its own (they apply
// whatever the others decide), then the other takes as one atomic step,
// then the reservations of an admitted call are opened.
func (s *Store) takeHolding(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	now := s.clock.Now()
	for i := range takes {
		if len(takes[i].Hold) > sluice.MaxHoldLen {
			return fmt.Errorf("memory: rule %q: reservation id longer than %d bytes", takes[i].Rule, sluice.MaxHoldLen)
		}
	}
	var rest []sluice.Take
	var idx []int
	opens := 0
	for i := range takes {
		if tk := &takes[i]; tk.Hold != "" && !tk.Settle && tk.Cost > 0 && !tk.DryRun && tk.HoldFor > 0 {
			opens++
		}
	}
	// Room for the reservations first: a call the store cannot record is
	// refused whole, before anything is taken.
	if opens > 0 {
		if ok, wait := s.holds.room(opens, now); !ok {
			for i := range takes {
				out[i] = sluice.Decision{Reason: sluice.ReasonUnavailable, RetryAfter: wait}
			}
			return nil
		}
	}
	for i := range takes {
		tk := &takes[i]
		if tk.Charge && tk.Cost > 0 { // applies whatever the others decide, as a settle
			t, err := s.table(tk.Rule, tk.Limit)
			if err != nil {
				return err
			}
			r := t.chargeKey(tk.Key, now, tk.Cost)
			decide(&out[i], t.meta(), &r)
			continue
		}
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
			s.holds.open(holdKey{tk.Rule, tk.Key, tk.Hold}, tk.Cost, now+int64(tk.HoldFor))
		}
	}
	return nil
}

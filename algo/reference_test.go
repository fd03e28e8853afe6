package algo

import (
	"fmt"
	"math"
	"math/big"
	"slices"

	"github.com/sluice-rl/sluice"
)

// The reference models below restate each algorithm's definition in the most
// direct way available, trading speed and memory for obviousness: rational
// token counts, a list of every departure or every admitted unit, a map of
// window counts, and a binary search for the earliest admitting instant. The
// fast implementations must agree with them to the nanosecond.

type model interface {
	take(now, cost int64) Result
}

// refBucket is a token bucket with exact rational tokens, refilled at one
// token per T. It models token-bucket, leaky-meter and gcra.
type refBucket struct {
	b, T    int64
	tokens  *big.Rat
	last    int64
	started bool
}

func (m *refBucket) take(now, cost int64) Result {
	if !m.started {
		m.started, m.last, m.tokens = true, now, big.NewRat(m.b, 1)
	}
	if now > m.last {
		m.tokens.Add(m.tokens, big.NewRat(now-m.last, m.T))
		if m.tokens.Cmp(big.NewRat(m.b, 1)) > 0 {
			m.tokens.SetInt64(m.b)
		}
		m.last = now
	}
	nanos := func(units *big.Rat) int64 { // units*T, always a whole number here
		v := new(big.Rat).Mul(units, big.NewRat(m.T, 1))
		if !v.IsInt() {
			panic("fractional nanoseconds")
		}
		return v.Num().Int64()
	}
	whole := func() int64 { return max(new(big.Int).Quo(m.tokens.Num(), m.tokens.Denom()).Int64(), 0) }
	missing := func() int64 { return nanos(new(big.Rat).Sub(big.NewRat(m.b, 1), m.tokens)) }
	c := big.NewRat(cost, 1)
	switch {
	case cost == 0 && m.tokens.Sign() < 0: // in debt: over until refilled to 0
		return Result{Reason: sluice.ReasonLimited, RetryAfter: nanos(new(big.Rat).Neg(m.tokens)), ResetAfter: missing()}
	case cost == 0:
		return Result{Allowed: true, Remaining: whole(), ResetAfter: missing()}
	case cost > m.b:
		return Result{Reason: sluice.ReasonTooLarge, Remaining: whole(), ResetAfter: missing()}
	case m.tokens.Cmp(c) < 0:
		return Result{Reason: sluice.ReasonLimited, Remaining: whole(),
			RetryAfter: nanos(new(big.Rat).Sub(c, m.tokens)), ResetAfter: missing()}
	}
	m.tokens.Sub(m.tokens, c)
	return Result{Allowed: true, Remaining: whole(), ResetAfter: missing()}
}

// refQueue keeps the departure time of every admitted unit.
type refQueue struct {
	b, T    int64
	deps    []int64
	lastDep int64
}

func (m *refQueue) queued(now int64) int64 {
	n := int64(0)
	for _, d := range m.deps {
		if d > now {
			n++
		}
	}
	return n
}

func (m *refQueue) take(now, cost int64) Result {
	q := min(m.queued(now), m.b) // charges may queue more than b units
	reset := int64(0)
	if len(m.deps) > 0 {
		reset = max(0, m.lastDep+m.T-now)
	}
	switch {
	case cost == 0 && m.queued(now) > m.b:
		// In debt: over until at most b departures are after now, at the
		// (b+1)-th latest departure.
		desc := slices.Clone(m.deps)
		slices.Sort(desc)
		slices.Reverse(desc)
		return Result{Reason: sluice.ReasonLimited, RetryAfter: desc[m.b] - now, ResetAfter: reset}
	case cost == 0:
		return Result{Allowed: true, Remaining: m.b - q, ResetAfter: reset}
	case cost > m.b:
		return Result{Reason: sluice.ReasonTooLarge, Remaining: m.b - q, ResetAfter: reset}
	case q+cost > m.b:
		// The earliest t with at most b-cost departures after it is the
		// (b-cost+1)-th latest departure.
		desc := slices.Clone(m.deps)
		slices.Sort(desc)
		slices.Reverse(desc)
		return Result{Reason: sluice.ReasonLimited, Remaining: m.b - q,
			RetryAfter: desc[m.b-cost] - now, ResetAfter: reset}
	}
	for range cost {
		d := now
		if len(m.deps) > 0 {
			d = max(now, m.lastDep+m.T)
		}
		m.deps = append(m.deps, d)
		m.lastDep = d
	}
	return Result{Allowed: true, Remaining: m.b - m.queued(now),
		ResetAfter: m.lastDep + m.T - now, Delay: m.lastDep - now}
}

// refFixed counts per aligned window in a map.
type refFixed struct {
	L, W   int64
	counts map[int64]int64
}

func (m *refFixed) take(now, cost int64) Result {
	idx := floorDiv(now, m.W)
	n := m.counts[idx]
	end := (idx+1)*m.W - now
	rem := max(m.L-n, 0)
	reset := int64(0)
	if n > 0 {
		reset = end
	}
	switch {
	case cost == 0 && n > m.L: // in debt: over until the window ends
		return Result{Reason: sluice.ReasonLimited, RetryAfter: end, ResetAfter: reset}
	case cost == 0:
		return Result{Allowed: true, Remaining: rem, ResetAfter: reset}
	case cost > m.L:
		return Result{Reason: sluice.ReasonTooLarge, Remaining: rem, ResetAfter: reset}
	case n+cost > m.L:
		return Result{Reason: sluice.ReasonLimited, Remaining: rem, RetryAfter: end, ResetAfter: reset}
	}
	m.counts[idx] = n + cost
	return Result{Allowed: true, Remaining: m.L - n - cost, ResetAfter: end}
}

// refLog keeps every admitted unit's time forever.
type refLog struct {
	L, W    int64
	entries []int64
}

func (m *refLog) inWindow(now int64) []int64 {
	var in []int64
	for _, e := range m.entries {
		if e > now-m.W {
			in = append(in, e)
		}
	}
	return in
}

func (m *refLog) take(now, cost int64) Result {
	if len(m.entries) > 0 { // an earlier now counts as the newest entry's time
		now = max(now, slices.Max(m.entries))
	}
	in := m.inWindow(now)
	n := int64(len(in))
	reset := int64(0)
	if n > 0 {
		reset = slices.Max(in) + m.W - now
	}
	switch {
	case cost == 0 && n > m.L: // over, after a carry from a larger limit: until n-L have left
		slices.Sort(in)
		return Result{Reason: sluice.ReasonLimited, RetryAfter: in[n-m.L-1] + m.W - now, ResetAfter: reset}
	case cost == 0:
		return Result{Allowed: true, Remaining: m.L - n, ResetAfter: reset}
	case cost > m.L:
		return Result{Reason: sluice.ReasonTooLarge, Remaining: max(m.L-n, 0), ResetAfter: reset}
	case n+cost > m.L:
		// The earliest t with at most L-cost entries in (t-W, t]: the
		// (L-cost+1)-th newest entry must have left.
		slices.Sort(in)
		slices.Reverse(in)
		return Result{Reason: sluice.ReasonLimited, Remaining: max(m.L-n, 0),
			RetryAfter: in[m.L-cost] + m.W - now, ResetAfter: reset}
	}
	for range cost {
		m.entries = append(m.entries, now)
	}
	return Result{Allowed: true, Remaining: m.L - n - cost, ResetAfter: m.W}
}

// refSliding keeps per-window counts in a map and evaluates the estimate
// prev*(W-e)/W + cur as an exact rational; the retry instant is found by
// binary search over the admit predicate, which can only turn true with time.
type refSliding struct {
	L, W   int64
	counts map[int64]int64
}

// scaled is the estimate times W, prev*(W-e) + cur*W: an integer, so the
// comparisons with L below are exact. The test's counts and windows keep it
// far below overflow; refMul fails loudly if that ever changes.
func (m *refSliding) scaled(t int64) int64 {
	idx := floorDiv(t, m.W)
	e := t - idx*m.W
	return refMul(m.counts[idx-1], m.W-e) + refMul(m.counts[idx], m.W)
}

func (m *refSliding) admits(t, cost int64) bool {
	return m.scaled(t)+refMul(cost-1, m.W) < refMul(m.L, m.W)
}

func (m *refSliding) over(t int64) bool { return m.scaled(t) > refMul(m.L, m.W) }

// refMul is a*b, and panics where that overflows int64.
func refMul(a, b int64) int64 {
	p := a * b
	if a != 0 && (p/a != b || (a == -1 && b == math.MinInt64)) {
		panic(fmt.Sprintf("reference: %d*%d overflows int64", a, b))
	}
	return p
}

func (m *refSliding) remaining(t int64) int64 {
	k := int64(0)
	for k < m.L && m.admits(t, k+1) {
		k++
	}
	return k
}

func (m *refSliding) resetAfter(t int64) int64 {
	idx := floorDiv(t, m.W)
	switch {
	case m.counts[idx] > 0:
		return (idx+2)*m.W - t
	case m.counts[idx-1] > 0:
		return (idx+1)*m.W - t
	}
	return 0
}

func (m *refSliding) take(now, cost int64) Result {
	rem, reset := m.remaining(now), m.resetAfter(now)
	switch {
	case cost == 0 && m.over(now):
		// In debt: over until the estimate is back to at most L.
		lo, hi := now, now+2*m.W
		for lo < hi {
			mid := lo + (hi-lo)/2
			if !m.over(mid) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return Result{Reason: sluice.ReasonLimited, RetryAfter: lo - now, ResetAfter: reset}
	case cost == 0:
		return Result{Allowed: true, Remaining: rem, ResetAfter: reset}
	case cost > m.L:
		return Result{Reason: sluice.ReasonTooLarge, Remaining: rem, ResetAfter: reset}
	case !m.admits(now, cost):
		lo, hi := now, now+2*m.W // admits at hi: both counts are gone by then
		for lo < hi {
			mid := lo + (hi-lo)/2
			if m.admits(mid, cost) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return Result{Reason: sluice.ReasonLimited, Remaining: rem, RetryAfter: lo - now, ResetAfter: reset}
	}
	m.counts[floorDiv(now, m.W)] += cost
	return Result{Allowed: true, Remaining: m.remaining(now), ResetAfter: m.resetAfter(now)}
}

func newReference(p Params) model {
	switch p.Algorithm {
	case sluice.GCRA, sluice.TokenBucket, sluice.LeakyMeter:
		return &refBucket{b: p.Burst, T: p.T}
	case sluice.LeakyQueue:
		return &refQueue{b: p.Burst, T: p.T}
	case sluice.FixedWindow:
		return &refFixed{L: p.Burst, W: p.W, counts: map[int64]int64{}}
	case sluice.SlidingLog:
		return &refLog{L: p.Burst, W: p.W}
	case sluice.SlidingWindow:
		return &refSliding{L: p.Burst, W: p.W, counts: map[int64]int64{}}
	}
	panic("no reference for " + p.Algorithm.String())
}

// fast adapts the real implementations to the model interface.
type fast struct{ State }

func newFast(p Params) *fast { return &fast{State{P: p}} }

func (f *fast) take(now, cost int64) (r Result) {
	f.Take(now, cost, &r)
	return r
}

// The charges of the reference models restate Charge: take the units
// whatever the limit says.
type chargeModel interface {
	model
	charge(now, units int64)
}

func (m *refBucket) charge(now, units int64) {
	m.take(now, 0) // start and refill
	m.tokens.Sub(m.tokens, big.NewRat(units, 1))
}

func (m *refQueue) charge(now, units int64) {
	for range units {
		d := now
		if len(m.deps) > 0 {
			d = max(now, m.lastDep+m.T)
		}
		m.deps = append(m.deps, d)
		m.lastDep = d
	}
}

func (m *refFixed) charge(now, units int64) { m.counts[floorDiv(now, m.W)] += units }

func (m *refLog) charge(now, units int64) {
	if len(m.entries) > 0 {
		now = max(now, slices.Max(m.entries))
	}
	for room := m.L - int64(len(m.inWindow(now))); room > 0 && units > 0; room, units = room-1, units-1 {
		m.entries = append(m.entries, now)
	}
}

func (m *refSliding) charge(now, units int64) { m.counts[floorDiv(now, m.W)] += units }

func (f *fast) charge(now, units int64) { f.Charge(now, units) }

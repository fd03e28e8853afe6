package algo

import (
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The reference models' carries restate the rule in their own terms: the
// units a bucket or queue has spent (an exact rational) are spent under the
// new limit too, rounded up to whole nanoseconds of its pace; a window keeps
// what it counted in the window that holds now.

type carryModel interface {
	model
	carry(to Params, now int64)
}

func (m *refBucket) carry(to Params, now int64) {
	if m.started {
		m.take(now, 0) // refilled to now
		spent := new(big.Rat).Sub(big.NewRat(m.b, 1), m.tokens)
		ns := new(big.Rat).Mul(spent, big.NewRat(to.T, 1))
		whole := new(big.Int).Quo(ns.Num(), ns.Denom())
		if !ns.IsInt() && ns.Sign() > 0 {
			whole.Add(whole, big.NewInt(1))
		}
		m.tokens = new(big.Rat).Sub(big.NewRat(to.Burst, 1), new(big.Rat).SetFrac(whole, big.NewInt(to.T)))
	}
	m.b, m.T = to.Burst, to.T
}

func (m *refQueue) carry(to Params, now int64) {
	backlog := int64(0)
	if len(m.deps) > 0 {
		backlog = m.lastDep + m.T - now
	}
	from := m.T
	m.b, m.T, m.deps = to.Burst, to.T, nil
	if backlog <= 0 {
		return
	}
	// The backlog, units times the old pace, becomes the same units at the
	// new pace (whole nanoseconds, rounded up): the queue as if its units
	// had been queued at the new pace.
	q, r := new(big.Int).QuoRem(new(big.Int).Mul(big.NewInt(backlog), big.NewInt(to.T)), big.NewInt(from), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	m.lastDep = now + q.Int64() - to.T
	for d := m.lastDep; d > now || d == m.lastDep; d -= to.T {
		m.deps = append(m.deps, d)
	}
	slices.Reverse(m.deps)
}

func (m *refFixed) carry(to Params, now int64) {
	n := m.counts[floorDiv(now, m.W)]
	m.L, m.W, m.counts = to.Burst, to.W, map[int64]int64{}
	if n > 0 {
		m.counts[floorDiv(now, to.W)] = n
	}
}

func (m *refLog) carry(to Params, now int64) {
	if len(m.entries) > 0 {
		now = max(now, slices.Max(m.entries))
	}
	var keep []int64
	for _, e := range m.entries {
		if e > now-min(to.W, m.W) {
			keep = append(keep, e)
		}
	}
	m.L, m.W, m.entries = to.Burst, to.W, keep
}

func (m *refSliding) carry(to Params, now int64) {
	if to.W == m.W {
		m.L = to.Burst
		return
	}
	scaled := m.scaled(now)
	est := (scaled + m.W - 1) / m.W
	m.L, m.W, m.counts = to.Burst, to.W, map[int64]int64{}
	if est > 0 {
		m.counts[floorDiv(now, to.W)] = est
	}
}

func (f *fast) carry(to Params, now int64) { f.Carry(to, now) }

// Every algorithm carries a key's state across changes of its limit
// exactly as its reference does: random traffic, the limit changed at
// random moments to random others (raised, lowered, other periods), every
// answer compared.
func TestCarryMatchesReferenceOnRandomTraffic(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			for seed := range uint64(300) {
				rng := rand.New(rand.NewPCG(seed, uint64(a)+100))
				l := randomLimit(rng, a)
				p, err := NewParams(l)
				if err != nil {
					t.Fatal(err)
				}
				ref, got := newReference(p).(carryModel), newFast(p)
				now := int64(1_700_000_000_000_000_000) + rng.Int64N(int64(time.Hour))
				for i := range 300 {
					if rng.IntN(25) == 0 {
						l = randomLimit(rng, a)
						to, err := NewParams(l)
						if err != nil {
							t.Fatal(err)
						}
						ref.carry(to, now)
						got.carry(to, now)
						p = to
					}
					now += randomGap(rng, &p)
					cost := randomCost(rng, &p)
					want, have := ref.take(now, cost), got.take(now, cost)
					if want != have {
						t.Fatalf("seed %d limit %v step %d take(now=%d, cost=%d):\n got  %+v\n want %+v", seed, l, i, now, cost, have, want)
					}
				}
			}
		})
	}
}

// The operator's case for each algorithm: a key used 3 of 3 in 10 minutes;
// raised to 6 it admits 3 more, lowered to 2 it admits none, and handed back
// to 3 after a raise it admits nothing more than the 3 already used.
func TestCarryRaiseAdmitsTheDifferenceLowerAdmitsNone(t *testing.T) {
	lim := func(a sluice.Algorithm, n int64) Params {
		p, err := NewParams(sluice.Limit{Algorithm: a, Rate: n, Period: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	burst := func(s *State, now int64) (n int) {
		for n = 0; n < 1000; n++ {
			var r Result
			s.Take(now, 1, &r)
			if !r.Allowed {
				return n
			}
		}
		return n
	}
	now := int64(1_700_000_000_000_000_000) - 1_700_000_000_000_000_000%int64(10*time.Minute) + int64(time.Minute)
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			for _, c := range []struct {
				to   int64
				want int
			}{{6, 3}, {2, 0}, {3, 0}, {100, 97}} {
				// The leaky queue admits one more than it queues (the
				// unit leaving now): count from what a fresh key admits.
				s := NewState(lim(a, 3))
				used := burst(s, now)
				c.want = max(0, burst(NewState(lim(a, c.to)), now)-used)
				s.Carry(lim(a, c.to), now+1)
				if n := burst(s, now+1); n != c.want {
					t.Errorf("used 3 of 3, then %d per 10m: %d more admitted at once, want %d", c.to, n, c.want)
				}
			}
			// Raised to 6, 1 more used (4 of 6), handed back to 3: none more.
			s := NewState(lim(a, 3))
			burst(s, now)
			s.Carry(lim(a, 6), now)
			var r Result
			s.Take(now, 1, &r)
			s.Carry(lim(a, 3), now)
			if n := burst(s, now); n != 0 {
				t.Errorf("4 used under 6, back to 3: %d admitted, want 0", n)
			}
		})
	}
}

// Huge backlogs and limits far apart saturate instead of overflowing: the
// key stays refused, never wraps to fresh.
func TestCarrySaturatesAtTheEdges(t *testing.T) {
	slow, err := NewParams(sluice.Limit{Rate: 1, Period: time.Duration(sluice.MaxCapacity)})
	if err != nil {
		t.Fatal(err)
	}
	fastest, err := NewParams(sluice.Limit{Rate: 1, Period: 1})
	if err != nil {
		t.Fatal(err)
	}
	now := int64(1 << 62)
	g := GCRA{TAT: math.MaxInt64}.Carry(&fastest, &slow, now)
	if g.TAT <= now {
		t.Fatalf("a saturated backlog carried to a slower limit became idle: %d", g.TAT)
	}
	var r Result
	g.Take(&slow, now, 1, &r)
	if r.Allowed {
		t.Fatal("a key with a saturated backlog was admitted after the carry")
	}
	tb := TokenBucket{Tokens: -maxInt / 8, Last: now}.Carry(&fastest, &slow, now)
	tb.Take(&slow, now, 1, &r)
	if r.Allowed {
		t.Fatal("a bucket deep in debt was admitted after the carry")
	}
	// Time going back: the carry counts from the later of now and the state.
	m := LeakyMeter{Level: fastest.D, Last: now}.Carry(&fastest, &slow, now-1000)
	if m.Level < slow.T {
		t.Fatalf("a full meter carried at an earlier now lost what it held: level %d", m.Level)
	}
}

const maxInt = math.MaxInt64

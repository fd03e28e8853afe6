package algo

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// randomLimit draws a small limit whose period is often not a multiple of its
// rate, so T is rounded.
func randomLimit(rng *rand.Rand, a sluice.Algorithm) sluice.Limit {
	periods := []time.Duration{time.Millisecond, time.Second, 999 * time.Millisecond, 7 * time.Second, time.Minute, 15 * time.Minute, 1234567}
	l := sluice.Limit{
		Algorithm: a,
		Rate:      1 + rng.Int64N(20),
		Period:    periods[rng.IntN(len(periods))],
	}
	if a.IsBucket() && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Int64N(30)
	}
	return l
}

// randomGap draws the time to the next request: often none (a burst), often
// about one unit's refill or one window, sometimes an enormous jump.
func randomGap(rng *rand.Rand, p *Params) int64 {
	unit := max(p.T, 1)
	if !p.Algorithm.IsBucket() {
		unit = max(p.W/max(p.Burst, 1), 1)
	}
	switch rng.IntN(10) {
	case 0, 1, 2:
		return 0
	case 3, 4, 5:
		return rng.Int64N(2 * unit)
	case 6:
		return unit
	case 7:
		return rng.Int64N(p.W + 1)
	case 8:
		return p.W - rng.Int64N(3) // just before, at or after a boundary
	default:
		if rng.IntN(10) == 0 {
			return rng.Int64N(1 << 50)
		}
		return rng.Int64N(10 * unit)
	}
}

func randomCost(rng *rand.Rand, p *Params) int64 {
	switch rng.IntN(20) {
	case 0:
		return 0
	case 1:
		return p.Burst + 1 + rng.Int64N(3)
	case 2, 3, 4:
		return 1 + rng.Int64N(p.Burst)
	}
	return 1
}

func TestAlgorithmsMatchReferenceOnRandomTraffic(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			for seed := range uint64(300) {
				rng := rand.New(rand.NewPCG(seed, uint64(a)))
				l := randomLimit(rng, a)
				p, err := NewParams(l)
				if err != nil {
					t.Fatal(err)
				}
				ref, got := newReference(p), newFast(p)
				now := int64(1_700_000_000_000_000_000) + rng.Int64N(int64(time.Hour))
				for i := range 300 {
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

// The bucket family must agree with each other on every take: GCRA and the
// leaky meter are the token bucket in other clothes.
func TestBucketAlgorithmsAgree(t *testing.T) {
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 42))
		l := randomLimit(rng, sluice.TokenBucket)
		impls := map[sluice.Algorithm]*fast{}
		for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.GCRA, sluice.LeakyMeter} {
			l.Algorithm = a
			p, err := NewParams(l)
			if err != nil {
				t.Fatal(err)
			}
			impls[a] = newFast(p)
		}
		p := impls[sluice.TokenBucket].P
		now := int64(1_700_000_000_000_000_000)
		for i := range 200 {
			now += randomGap(rng, &p)
			cost := randomCost(rng, &p)
			want := impls[sluice.TokenBucket].take(now, cost)
			for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.LeakyMeter} {
				if got := impls[a].take(now, cost); got != want {
					t.Fatalf("seed %d step %d: %v gave %+v, token-bucket %+v", seed, i, a, got, want)
				}
			}
		}
	}
}

// The textbook check: r=2/s, b=5 gives T=0.5s, tau=2s; five requests at t=0 pass, the
// sixth is rejected with retry-after 0.5s, and the token bucket agrees.
func TestGCRASpecExampleRejectsSixthOfFiveBurst(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyMeter} {
		p, err := NewParams(sluice.Limit{Rate: 2, Period: time.Second, Burst: 5, Algorithm: a})
		if err != nil {
			t.Fatal(err)
		}
		f := newFast(p)
		for i := range 5 {
			if r := f.take(0, 1); !r.Allowed || r.Remaining != int64(4-i) {
				t.Fatalf("%v: request %d: %+v, want allowed with %d remaining", a, i+1, r, 4-i)
			}
		}
		if a == sluice.GCRA && f.gcra.TAT != int64(2500*time.Millisecond) {
			t.Fatalf("TAT = %v, want 2.5s", time.Duration(f.gcra.TAT))
		}
		r := f.take(0, 1)
		if r.Allowed || r.Reason != sluice.ReasonLimited || r.RetryAfter != int64(500*time.Millisecond) {
			t.Fatalf("%v: sixth request: %+v, want limited with retry-after 0.5s", a, r)
		}
		if r.ResetAfter != int64(2500*time.Millisecond) {
			t.Fatalf("%v: reset-after %v, want 2.5s", a, time.Duration(r.ResetAfter))
		}
		if r := f.take(int64(500*time.Millisecond), 1); !r.Allowed {
			t.Fatalf("%v: at retry-after: %+v, want allowed", a, r)
		}
	}
}

func mustParams(t testing.TB, l sluice.Limit) Params {
	t.Helper()
	p, err := NewParams(l)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCostAboveBurstIsNeverAdmissible(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		p := mustParams(t, sluice.Limit{Rate: 10, Period: time.Second, Algorithm: a})
		f := newFast(p)
		for _, now := range []int64{0, int64(time.Hour), 1 << 60} {
			r := f.take(now, 11)
			if r.Allowed || r.Reason != sluice.ReasonTooLarge || r.RetryAfter != 0 || r.Remaining != 10 {
				t.Fatalf("%v: cost 11 of 10: %+v, want too-large, no retry, 10 remaining", a, r)
			}
		}
		if r := f.take(1<<60, 10); !r.Allowed {
			t.Fatalf("%v: cost 10 of 10 after too-large takes: %+v, want allowed: a too-large cost must consume nothing", a, r)
		}
	}
}

func TestCostZeroPeeksWithoutConsuming(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		p := mustParams(t, sluice.Limit{Rate: 3, Period: time.Minute, Algorithm: a})
		f := newFast(p)
		now := int64(1_700_000_000_000_000_000)
		left := f.take(now, 2).Remaining
		for range 5 {
			if r := f.take(now, 0); !r.Allowed || r.Remaining != left || r.RetryAfter != 0 {
				t.Fatalf("%v: peek: %+v, want allowed with %d remaining", a, r, left)
			}
		}
		for i := range left {
			if r := f.take(now, 1); !r.Allowed || r.Remaining != left-i-1 {
				t.Fatalf("%v: unit %d of %d left after peeks: %+v", a, i+1, left, r)
			}
		}
		if r := f.take(now, 1); r.Allowed {
			t.Fatalf("%v: unit past the limit allowed: %+v", a, r)
		}
	}
}

func TestInvalidLimitsAreErrorsNotPanics(t *testing.T) {
	for _, l := range []sluice.Limit{
		{Rate: 0, Period: time.Second},
		{Rate: -1, Period: time.Second},
		{Rate: 1, Period: 0},
		{Rate: 1, Period: -time.Second},
		{Rate: 1, Period: time.Second, Burst: -1},
		{Rate: 2, Period: 1},                           // two units per nanosecond
		{Rate: 1, Period: time.Second, Burst: 1 << 62}, // refill time overflows
		{Rate: 1, Period: sluice.MaxCapacity + 1},      // window too long
		{Rate: 5, Period: time.Second, Burst: 7, Algorithm: sluice.FixedWindow},
		{Rate: sluice.MaxLogLimit + 1, Period: time.Hour, Algorithm: sluice.SlidingLog},
		{Rate: 1, Period: time.Second, Algorithm: sluice.Algorithm(99)},
	} {
		if _, err := NewParams(l); err == nil {
			t.Errorf("NewParams(%+v) succeeded, want an error", l)
		}
	}
}

// A clock that steps back must never let more through than the latest time
// already seen would.
func TestTimeGoingBackwardsCountsAsNoElapsedTime(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000_000)
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			p := mustParams(t, sluice.Limit{Rate: 4, Period: time.Second, Algorithm: a})
			f := newFast(p)
			late := t0 + int64(1500*time.Millisecond) // mid-window, past several refills
			for f.take(late, 1).Allowed {
			}
			for _, back := range []int64{1, int64(time.Millisecond), int64(time.Second), int64(time.Hour), late} {
				r := f.take(late-back, 1)
				if r.Allowed {
					t.Fatalf("stepping back %v admitted a unit the latest time refused: %+v", time.Duration(back), r)
				}
				if r.RetryAfter <= 0 {
					t.Fatalf("stepping back %v: retry-after %v, want > 0", time.Duration(back), r.RetryAfter)
				}
			}
			// Forward again: the state was not corrupted by the trip back.
			ref := newFast(p)
			for ref.take(late, 1).Allowed {
			}
			for _, dt := range []int64{int64(250 * time.Millisecond), int64(time.Second), int64(10 * time.Second)} {
				if got, want := f.take(late+dt, 1), ref.take(late+dt, 1); got != want {
					t.Fatalf("after the clock stepped back, take at +%v = %+v, want %+v", time.Duration(dt), got, want)
				}
			}
		})
	}
}

func TestHugeGapsAndExtremeTimesDoNotOverflow(t *testing.T) {
	const maxT, minT = int64(1<<63 - 1), int64(-1 << 63)
	for _, a := range sluice.Algorithms() {
		for _, l := range []sluice.Limit{
			{Rate: 1, Period: sluice.MaxCapacity / 2, Algorithm: a},
			{Rate: 1_000_000_000, Period: time.Second, Algorithm: a},
			{Rate: 3, Period: time.Second, Algorithm: a},
		} {
			if a == sluice.SlidingLog && l.Rate > sluice.MaxLogLimit {
				l.Rate = sluice.MaxLogLimit
			}
			p := mustParams(t, l)
			f := newFast(p)
			for _, now := range []int64{minT, minT + 1, -1, 0, 1, maxT / 2, maxT - int64(time.Hour), maxT - 1, maxT} {
				for _, cost := range []int64{0, 1, p.Burst} {
					r := f.take(now, cost)
					if r.Remaining < 0 || r.Remaining > p.Burst || r.RetryAfter < 0 || r.ResetAfter < 0 || r.Delay < 0 {
						t.Fatalf("%v %v take(now=%d, cost=%d) = %+v: out of range", a, l, now, cost, r)
					}
				}
			}
			// After the largest gap the key is full again.
			g := newFast(p)
			g.take(minT/2, p.Burst)
			if r := g.take(maxT/2, p.Burst); !r.Allowed {
				t.Fatalf("%v %v: full burst after a gap of ~2^63 ns refused: %+v", a, l, r)
			}
		}
	}
}

func TestRetryAfterIsExactForEveryAlgorithm(t *testing.T) {
	// Waiting exactly RetryAfter admits the same cost; one nanosecond less does not.
	for _, a := range sluice.Algorithms() {
		for seed := range uint64(200) {
			rng := rand.New(rand.NewPCG(seed, 7))
			p := mustParams(t, randomLimit(rng, a))
			f := newFast(p)
			now := int64(1_700_000_000_000_000_000)
			for range 50 {
				now += randomGap(rng, &p)
				cost := 1 + rng.Int64N(p.Burst)
				r := f.take(now, cost)
				if r.Allowed || r.Reason != sluice.ReasonLimited {
					continue
				}
				if r.RetryAfter <= 0 {
					t.Fatalf("%v: limited with retry-after %d", a, r.RetryAfter)
				}
				early, onTime := *f, *f
				early.log, onTime.log = cloneLog(f.log), cloneLog(f.log)
				if e := early.take(now+r.RetryAfter-1, cost); e.Allowed {
					t.Fatalf("%v seed %d: allowed 1ns before retry-after %d: %+v", a, seed, r.RetryAfter, e)
				}
				if o := onTime.take(now+r.RetryAfter, cost); !o.Allowed {
					t.Fatalf("%v seed %d: refused at retry-after %d: %+v", a, seed, r.RetryAfter, o)
				}
			}
		}
	}
}

func cloneLog(s SlidingLog) SlidingLog {
	s.buf = append([]int64(nil), s.buf...)
	return s
}

func TestLeakyQueueDelaysAdmittedRequests(t *testing.T) {
	// r = 10/s, size 3: the first leaves at once, the next three wait 100,
	// 200 and 300 ms, the fifth finds the queue full.
	p := mustParams(t, sluice.Limit{Rate: 10, Period: time.Second, Burst: 3, Algorithm: sluice.LeakyQueue})
	var s LeakyQueue
	var r Result
	for i, want := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond} {
		s = s.Take(&p, 0, 1, &r)
		if !r.Allowed || r.Delay != int64(want) {
			t.Fatalf("request %d: %+v, want allowed with delay %v", i+1, r, want)
		}
	}
	s.Take(&p, 0, 1, &r)
	if r.Allowed || r.RetryAfter != int64(100*time.Millisecond) {
		t.Fatalf("fifth request: %+v, want limited for 100ms", r)
	}
}

func ExampleGCRA_Take() {
	p, _ := NewParams(sluice.Limit{Rate: 2, Period: time.Second, Burst: 5})
	var s GCRA
	var r Result
	for i := range 6 {
		s = s.Take(&p, 0, 1, &r)
		fmt.Println(i+1, r.Allowed, r.Remaining, time.Duration(r.RetryAfter))
	}
	// Output:
	// 1 true 4 0s
	// 2 true 3 0s
	// 3 true 2 0s
	// 4 true 1 0s
	// 5 true 0 0s
	// 6 false 0 500ms
}

func TestSlidingLogUndoReversesCommit(t *testing.T) {
	p := mustParams(t, sluice.Limit{Rate: 5, Period: time.Second, Algorithm: sluice.SlidingLog})
	var s SlidingLog
	var r Result
	s.Take(&p, 0, 2, &r)
	if s.Take(&p, 10, 3, &r); !r.Allowed {
		t.Fatal(r)
	}
	s.Undo(3)
	if s.Take(&p, 20, 0, &r); r.Remaining != 3 || r.ResetAfter != int64(time.Second)-20 {
		t.Fatalf("after undo: %+v, want 3 remaining and the first take's reset", r)
	}
}

// Taking c and refunding c at the same instant leaves every algorithm as it
// was (the sliding log exactly; the others to the nanosecond); refunding more
// than was taken never makes a key fuller than fresh.
func TestRefundUndoesATakeAndNeverOverfills(t *testing.T) {
	const now = int64(1_700_000_000_000_000_000)
	for _, a := range sluice.Algorithms() {
		p := mustParams(t, sluice.Limit{Rate: 5, Period: time.Second, Algorithm: a})
		s := NewState(p)
		var r Result
		s.Take(now, 2, &r)
		s.Take(now, 0, &r)
		before := r
		s.Take(now, 2, &r)
		s.Refund(now, 2)
		if s.Take(now, 0, &r); r != before {
			t.Fatalf("%v: after take+refund %+v, before %+v", a, r, before)
		}
		s.Refund(now, 100)
		fresh := NewState(p)
		var want Result
		fresh.Take(now, 0, &want)
		if s.Take(now, 0, &r); r.Remaining != want.Remaining {
			t.Fatalf("%v: over-refunded key has %d remaining, a fresh one %d", a, r.Remaining, want.Remaining)
		}
	}
}

// A log is idle only once its newest entry has left the window: while the
// oldest has left but a newer one has not, the key still holds state.
func TestSlidingLogIdleLooksAtTheNewestEntry(t *testing.T) {
	p, _ := NewParams(sluice.Limit{Rate: 3, Period: time.Second, Algorithm: sluice.SlidingLog})
	var s SlidingLog
	var r Result
	s.Take(&p, 0, 1, &r)
	s.Take(&p, int64(500*time.Millisecond), 1, &r)
	for _, tc := range []struct {
		now  time.Duration
		idle bool
	}{{999 * time.Millisecond, false}, {time.Second, false}, {1499 * time.Millisecond, false}, {1500 * time.Millisecond, true}} {
		if got := s.Idle(&p, int64(tc.now)); got != tc.idle {
			t.Errorf("Idle at %v = %v, want %v", tc.now, got, tc.idle)
		}
	}
}

// A log whose clock steps back logs the new entry at its newest entry's
// time, and measures from there: the entries stay in order and every reset
// is measured from the newest.
func TestSlidingLogWithAClockThatStepsBackLogsAtTheNewestTime(t *testing.T) {
	p, _ := NewParams(sluice.Limit{Rate: 8, Period: 10, Algorithm: sluice.SlidingLog})
	var s SlidingLog
	var r Result
	s.Take(&p, 100, 1, &r)
	s.Take(&p, 104, 1, &r)
	s.Take(&p, 50, 1, &r) // the clock stepped back: logged at 104
	if !r.Allowed || r.ResetAfter != 10 {
		t.Fatalf("take at an earlier time: %+v", r)
	}
	s.Decide(&p, 105, 0, &r)
	if r.Remaining != 5 || r.ResetAfter != 9 {
		t.Fatalf("at 105: remaining %d, reset %d; want 5 and 9 (entries at 100, 104, 104)", r.Remaining, r.ResetAfter)
	}
	s.Decide(&p, 60, 0, &r) // earlier than every entry: measured from the newest, 104
	if r.Remaining != 5 || r.ResetAfter != 10 {
		t.Fatalf("at 60: remaining %d, reset %d; want 5 and 10", r.Remaining, r.ResetAfter)
	}
	s.Decide(&p, 114, 0, &r)
	if r.Remaining != 8 || r.ResetAfter != 0 {
		t.Fatalf("at 114: remaining %d, reset %d; want all back", r.Remaining, r.ResetAfter)
	}
}

// Calendar windows follow the UTC calendar: a month from the 1st (29 days in
// February 2028), a week from Monday, a year from January 1st (366 days in
// 2028), a day from midnight.
func TestCalendarWindows(t *testing.T) {
	at := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixNano()
	}
	for _, tc := range []struct {
		unit          time.Duration
		t, start, end string
	}{
		{sluice.CalendarMonth, "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{sluice.CalendarMonth, "2026-12-31T12:00:00Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{sluice.CalendarWeek, "2026-11-30T08:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"}, // a Monday
		{sluice.CalendarWeek, "2026-11-29T23:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z"}, // a Sunday
		{sluice.CalendarYear, "2028-07-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z"},
		{sluice.CalendarDay, "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z"},
		{sluice.CalendarWeek, "1969-12-31T00:00:00Z", "1969-12-29T00:00:00Z", "1970-01-05T00:00:00Z"}, // before the epoch
	} {
		p, err := NewParams(sluice.Limit{Rate: 5, Period: tc.unit, Algorithm: sluice.FixedWindow, Calendar: true})
		if err != nil {
			t.Fatal(err)
		}
		s, e := p.window(at(tc.t))
		if s != at(tc.start) || e != at(tc.end) {
			t.Errorf("%v window of %s: [%s, %s), want [%s, %s)", tc.unit, tc.t, time.Unix(0, s).UTC(), time.Unix(0, e).UTC(), tc.start, tc.end)
		}
	}
	// Only a fixed window of a day, week, month or year may follow the calendar.
	for _, l := range []sluice.Limit{
		{Rate: 5, Period: time.Hour, Algorithm: sluice.FixedWindow, Calendar: true},
		{Rate: 5, Period: sluice.CalendarMonth, Algorithm: sluice.GCRA, Calendar: true},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%v: accepted", l)
		}
	}
}

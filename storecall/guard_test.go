package storecall

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sony/gobreaker/v2"
)

var errDown = errors.New("store down")

// The guard's defaults, and settings given that replace them.
func TestGuardDefaultsAndSettings(t *testing.T) {
	g := newGuard(&Options{}, func(string, string, string) {})
	if g.settings.Interval != DefaultBreakerWindow || g.settings.Timeout != DefaultBreakerOpenFor || g.settings.BucketPeriod != DefaultBreakerWindow/10 {
		t.Fatalf("defaults: %+v", g.settings)
	}
	g = newGuard(&Options{BreakerWindow: 20 * time.Second, BreakerOpenFor: 3 * time.Second}, func(string, string, string) {})
	if g.settings.Interval != 20*time.Second || g.settings.Timeout != 3*time.Second || g.settings.BucketPeriod != 2*time.Second {
		t.Fatalf("given: %+v", g.settings)
	}
	trip := g.settings.ReadyToTrip
	for _, tc := range []struct {
		requests, failures uint32
		want               bool
	}{{40, 20, true}, {41, 20, false}, {20, 20, true}, {30, 19, false}, {100, 50, true}, {100, 49, false}} {
		if got := trip(gobreaker.Counts{Requests: tc.requests, TotalFailures: tc.failures}); got != tc.want {
			t.Errorf("%d failures of %d calls: trips %v, want %v", tc.failures, tc.requests, got, tc.want)
		}
	}
}

// The deadline follows the store's successful latency within its clamp, and
// a store that never succeeds does not stretch it.
func TestAdaptiveDeadline(t *testing.T) {
	g := newGuard(&Options{}, func(string, string, string) {})
	if d := g.deadline(); d != MaxTimeout {
		t.Fatalf("fresh: %v, want the cap until the store is known", d)
	}
	for range 2000 {
		g.lat.observe(time.Millisecond)
	}
	if d := g.deadline(); d != MinTimeout {
		t.Fatalf("after fast calls: %v", d)
	}
	g.lat.observe(30 * time.Millisecond)
	if d := g.deadline(); d != 120*time.Millisecond {
		t.Fatalf("after 30ms: %v", d)
	}
	g.lat.observe(2 * time.Second)
	if d := g.deadline(); d != MaxTimeout {
		t.Fatalf("after 2s: %v, want the cap", d)
	}
	for range 2000 {
		g.lat.observe(time.Millisecond)
	}
	if d := g.deadline(); d != MinTimeout {
		t.Fatalf("after many fast calls: %v", d)
	}
	// A store that stops answering in time pushes the deadline up to the
	// cap, four times per missed round, never past it.
	slow := newGuard(&Options{}, func(string, string, string) {})
	for range 2000 {
		slow.lat.observe(time.Millisecond)
	}
	stall := stallStore{}
	var seen []time.Duration
	for range 5 {
		seen = append(seen, slow.deadline())
		slow.call(context.Background(), stall, "", 0, nil, nil)
	}
	if fmt.Sprint(seen) != "[50ms 200ms 250ms 250ms 250ms]" {
		t.Fatalf("deadlines against a store that never answers: %v", seen)
	}
	fixed := newGuard(&Options{Timeout: 7 * time.Millisecond}, func(string, string, string) {})
	fixed.lat.observe(time.Second)
	if d := fixed.deadline(); d != 7*time.Millisecond {
		t.Fatalf("fixed: %v", d)
	}
}

// The breaker opens on a failure rate, not on a streak: 19 failures among
// many successes leave it closed; 20 failures that are half the calls open
// it; a partition's failures leave the others closed.
func TestBreakerOpensOnAFailureRatePerPartition(t *testing.T) {
	g := newGuard(&Options{Timeout: time.Second}, func(string, string, string) {})
	ok := &fixedStore{}
	bad := &fixedStore{err: errDown}
	for i := range 200 {
		s := ok
		if i%10 == 0 {
			s = bad
		}
		g.call(context.Background(), s, "a", 0, nil, nil)
	}
	if st := g.states()["a"]; st != "closed" {
		t.Fatalf("20 failures among 200 calls opened the breaker: %s", st)
	}
	for range 200 {
		g.call(context.Background(), bad, "b", 0, nil, nil)
	}
	if st := g.states()["b"]; st != "open" {
		t.Fatalf("b failing: %s", st)
	}
	if st := g.states()["a"]; st != "closed" {
		t.Fatalf("a's breaker followed b's: %s", st)
	}
}

// stallStore answers only when its context ends.
type stallStore struct{}

func (stallStore) Take(ctx context.Context, _ []sluice.Take, _ []sluice.Decision) error {
	<-ctx.Done()
	return ctx.Err()
}

type fixedStore struct{ err error }

func (f *fixedStore) Take(context.Context, []sluice.Take, []sluice.Decision) error { return f.err }

// The peak estimate: a higher sample replaces it; a lower one pulls it down
// by 1/64 of the gap, exactly.
func TestLatencyPeakFollowsSamples(t *testing.T) {
	var l latency
	l.observe(64 * time.Millisecond)
	if p := time.Duration(l.peak.Load()); p != 64*time.Millisecond {
		t.Fatalf("after 64ms: %v", p)
	}
	l.observe(0)
	if p := time.Duration(l.peak.Load()); p != 63*time.Millisecond {
		t.Fatalf("after a 0 sample: %v, want 63ms (1/64 of the gap down)", p)
	}
	l.observe(32*time.Millisecond + 1)
	if p := time.Duration(l.peak.Load()); p != 63*time.Millisecond-(31*time.Millisecond-1)/64 {
		t.Fatalf("after 32ms: %v", p)
	}
	l.observe(time.Second)
	if p := time.Duration(l.peak.Load()); p != time.Second {
		t.Fatalf("after 1s: %v", p)
	}
}

type deadlineStore struct {
	sleep time.Duration
	left  time.Duration
}

func (s *deadlineStore) Take(ctx context.Context, _ []sluice.Take, _ []sluice.Decision) error {
	if dl, ok := ctx.Deadline(); ok {
		s.left = time.Until(dl)
	}
	time.Sleep(s.sleep)
	return nil
}

// The process's own scheduling latency extends a call's deadline, and a
// quarter of it is taken off the latency the call is measured at (the rest
// of the wait is the store's, as far as the guard can tell).
func TestSchedulingLatencyExtendsACallsDeadlineAndDiscountsItsLatency(t *testing.T) {
	g := newGuard(&Options{}, func(string, string, string) {})
	g.sched.last.Store(time.Now().Add(time.Hour).UnixNano()) // no read of the runtime's histogram
	g.sched.delay.Store(int64(time.Second))
	s := &deadlineStore{}
	if err := g.call(context.Background(), s, "", 0, nil, nil); err != nil {
		t.Fatal(err)
	}
	if s.left < 500*time.Millisecond { // the deadline (at most MaxTimeout) plus 1 s
		t.Fatalf("the call had %v left, want its deadline extended by the scheduling latency (1 s)", s.left)
	}
	if p := time.Duration(g.lat.peak.Load()); p >= MaxTimeout {
		t.Fatalf("a fast call with a 1 s scheduling latency measured at %v, want about 0: the latency is discounted", p)
	}
	// A call slower than a quarter of the extension is measured at the rest.
	g2 := newGuard(&Options{}, func(string, string, string) {})
	g2.lat.peak.Store(0)
	g2.sched.last.Store(time.Now().Add(time.Hour).UnixNano())
	g2.sched.delay.Store(int64(40 * time.Millisecond))
	if err := g2.call(context.Background(), &deadlineStore{sleep: 20 * time.Millisecond}, "", 0, nil, nil); err != nil {
		t.Fatal(err)
	}
	if p := time.Duration(g2.lat.peak.Load()); p < 10*time.Millisecond {
		t.Fatalf("a call of at least 20 ms with 40 ms of scheduling latency measured at %v, want at least 10 ms", p)
	}
}

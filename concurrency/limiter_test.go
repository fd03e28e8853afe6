package concurrency

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestFixedLimitHoldsAndFrees(t *testing.T) {
	l := New(Fixed{N: 3}, Options{})
	var ps []Permit
	for range 3 {
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if _, err := l.Acquire(context.Background()); !errors.Is(err, ErrLimited) {
		t.Fatalf("a fourth permit under a limit of 3: %v", err)
	}
	ps[0].Release(Success)
	if _, err := l.Acquire(context.Background()); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if l.InFlight() != 3 || l.Limit() != 3 {
		t.Fatalf("in flight %d, limit %d", l.InFlight(), l.Limit())
	}
}

// A queued request gets the permit another releases; one that waits past
// the queue's deadline, or finds the queue full, is refused.
func TestQueueWaitsWithinItsBounds(t *testing.T) {
	l := New(Fixed{N: 1}, Options{Queue: 1, QueueTimeout: time.Hour})
	p, _ := l.Acquire(context.Background())
	got := make(chan error, 1)
	go func() {
		q, err := l.Acquire(context.Background())
		if err == nil {
			q.Release(Success)
		}
		got <- err
	}()
	for l.waiting.Load() == 0 { // the waiter is queued
		time.Sleep(time.Millisecond)
	}
	if _, err := l.Acquire(context.Background()); !errors.Is(err, ErrLimited) {
		t.Fatalf("a second waiter in a queue of 1: %v", err)
	}
	p.Release(Success)
	if err := <-got; err != nil {
		t.Fatalf("the queued request: %v", err)
	}
	short := New(Fixed{N: 1}, Options{Queue: 4, QueueTimeout: time.Millisecond})
	short.Acquire(context.Background())
	if _, err := short.Acquire(context.Background()); !errors.Is(err, ErrLimited) {
		t.Fatalf("past the queue's deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l2 := New(Fixed{N: 1}, Options{Queue: 4, QueueTimeout: time.Hour})
	l2.Acquire(context.Background())
	if _, err := l2.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v", err)
	}
}

// AIMD adds one per success while busy, cuts by its backoff on a drop or a
// timeout, and stays within [Min, Max].
func TestAIMD(t *testing.T) {
	a := AIMD{Start: 10, Backoff: 0.5, Timeout: time.Second}
	for _, tc := range []struct {
		limit    float64
		rtt      time.Duration
		inflight int
		dropped  bool
		want     float64
	}{
		{10, time.Millisecond, 5, false, 11}, // busy: grows
		{10, time.Millisecond, 4, false, 10}, // idle: stays
		{10, time.Millisecond, 9, true, 5},   // a drop: halves
		{10, 2 * time.Second, 9, false, 5},   // a timeout: halves
	} {
		if got := a.Update(tc.limit, tc.rtt, tc.inflight, tc.dropped); got != tc.want {
			t.Errorf("Update(%v, %v, %d, %v) = %v, want %v", tc.limit, tc.rtt, tc.inflight, tc.dropped, got, tc.want)
		}
	}
	l := New(AIMD{Start: 4}, Options{Min: 2, Max: 6})
	for range 20 { // busy: every permit the limit allows, held at once
		var ps []Permit
		for range l.Limit() {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			p.Release(Success)
		}
	}
	if l.Limit() != 6 {
		t.Fatalf("limit %d after many busy successes, want the Max 6", l.Limit())
	}
	for range 20 {
		p, _ := l.Acquire(context.Background())
		p.Release(Dropped)
	}
	if l.Limit() != 2 {
		t.Fatalf("limit %d after many drops, want the Min 2", l.Limit())
	}
}

// Gradient2 grows while latency stays as usual and shrinks when recent
// requests slow down, before anything is dropped.
func TestGradient2FollowsLatency(t *testing.T) {
	g := NewGradient2(Gradient2{Start: 50})
	limit := g.Initial()
	for range 200 { // steady 10 ms, busy
		limit = g.Update(limit, 10*time.Millisecond, int(limit), false)
	}
	grown := limit
	if grown <= 50 {
		t.Fatalf("limit %.1f after steady latency, want it grown from 50", grown)
	}
	for range 50 { // the service slows down 4x
		limit = g.Update(limit, 40*time.Millisecond, int(limit), false)
	}
	if limit >= grown*0.7 {
		t.Fatalf("limit %.1f after a 4x slowdown, from %.1f: want it well down", limit, grown)
	}
}

// Under many goroutines the permits held never exceed the limit, and every
// one is given back. Run under -race.
func TestPermitsNeverExceedTheLimit(t *testing.T) {
	l := New(NewGradient2(Gradient2{Start: 8}), Options{Min: 2, Max: 16, Queue: 8, QueueTimeout: time.Millisecond})
	var most atomic.Int64
	var held atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(300 * time.Millisecond)
	for g := range 32 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				p, err := l.Acquire(context.Background())
				if err != nil {
					continue
				}
				n := held.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Duration(g%3) * 100 * time.Microsecond)
				held.Add(-1)
				out := Success
				if i%17 == 0 {
					out = Dropped
				}
				p.Release(out)
			}
		})
	}
	wg.Wait()
	if most.Load() > 16 || most.Load() < 2 {
		t.Fatalf("at most %d permits held at once, with Max 16", most.Load())
	}
	if l.InFlight() != 0 {
		t.Fatalf("%d permits never given back", l.InFlight())
	}
}

func TestAcquireAndReleaseAllocateNothing(t *testing.T) {
	l := New(NewGradient2(Gradient2{}), Options{})
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		p, _ := l.Acquire(ctx)
		p.Release(Success)
	}); n != 0 {
		t.Fatalf("%.1f allocations per acquire and release", n)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	l := New(NewGradient2(Gradient2{}), Options{Max: 1 << 20})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, _ := l.Acquire(ctx)
			p.Release(Success)
		}
	})
}

// With tiers, a lower level stops at its share while a higher one takes
// the rest of the limit.
func TestTiersKeepTheirShareOfTheLimit(t *testing.T) {
	l := New(Fixed{N: 10}, Options{Tiers: []float64{0.2, 0.3}}) // critical keeps 2, default 3
	var held []Permit
	take := func(level int) int {
		n := 0
		for range 20 {
			if p, err := l.AcquireAt(context.Background(), level); err == nil {
				held = append(held, p)
				n++
			}
		}
		return n
	}
	if got := []int{take(2), take(1), take(0)}; got[0] != 5 || got[1] != 3 || got[2] != 2 {
		t.Fatalf("sheddable, default, critical took %v permits of 10: want 5, 3, 2", got)
	}
	held[0].Release(Success)
	if _, err := l.AcquireAt(context.Background(), 2); err == nil {
		t.Fatal("a released permit went to the lowest level while the levels above held their shares")
	}
	if _, err := l.AcquireAt(context.Background(), 0); err != nil {
		t.Fatal("critical could not take the released permit")
	}
}

// A released permit goes to the highest level waiting in the queue, even
// one that came later.
func TestTheQueueWakesTheHighestLevelFirst(t *testing.T) {
	l := New(Fixed{N: 1}, Options{Queue: 4, QueueTimeout: 5 * time.Second, Tiers: []float64{0, 0}})
	held, _ := l.AcquireAt(context.Background(), 0)
	order := make(chan int, 2)
	wait := func(level int) {
		p, err := l.AcquireAt(context.Background(), level)
		if err != nil {
			t.Error(err)
			return
		}
		order <- level
		time.Sleep(10 * time.Millisecond)
		p.Release(Success)
	}
	go wait(2)
	for l.waitingAt[2].Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	go wait(0)
	for l.waitingAt[0].Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	held.Release(Success)
	if first, second := <-order, <-order; first != 0 || second != 2 {
		t.Fatalf("permits went to levels %d then %d: want the critical waiter first", first, second)
	}
}

func TestShedIsCountedByLevel(t *testing.T) {
	l := New(Fixed{N: 1}, Options{Tiers: []float64{0.5}})
	p, _ := l.AcquireAt(context.Background(), 0)
	for _, level := range []int{0, 1, 1, 7} {
		l.AcquireAt(context.Background(), level)
	}
	if l.ShedAt(0) != 1 || l.ShedAt(1) != 3 || l.Shed() != 4 {
		t.Fatalf("shed %d at 0, %d at 1, %d in all: want 1, 3, 4", l.ShedAt(0), l.ShedAt(1), l.Shed())
	}
	p.Release(Success)
}

// MinRTT settles where latency is within its buffer of the least seen.
// The model: 10 servers; of n requests in flight, the first 10 are served
// at once and the rest wait a service time per 10 ahead of them, so a
// request's latency depends on its place. The limit ends near 10; a drop
// cuts it; a service twice as slow for good is followed as the least
// latency forgets, and the limit comes back near 10 instead of sinking.
func TestMinRTTSettlesAtTheKnee(t *testing.T) {
	m := NewMinRTT(MinRTT{Start: 30, Buffer: 0.1, Smoothing: 0.1})
	limit := m.Initial()
	rng := rand.New(rand.NewPCG(1, 2))
	sample := func(base time.Duration) {
		n := max(int(limit), 1)
		place := 1 + rng.IntN(n)
		rtt := base * time.Duration(1+(place-1)/10)
		limit = m.Update(limit, rtt, place, false)
	}
	for range 5000 {
		sample(20 * time.Millisecond)
	}
	if limit < 8 || limit > 14 {
		t.Fatalf("limit %v after 5000 samples, want about 10", limit)
	}
	if got := m.Update(limit, 20*time.Millisecond, int(limit), true); got >= limit {
		t.Fatalf("a drop left the limit at %v (was %v)", got, limit)
	}
	for range 10000 {
		sample(40 * time.Millisecond)
	}
	if limit < 8 || limit > 14 {
		t.Fatalf("limit %v after the service slowed for good, want about 10", limit)
	}
}

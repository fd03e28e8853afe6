package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// TestBatchedCallsGetTheirOwnDecisions: 64 goroutines on one store, each
// with its own keys and limits, make calls of two takes (all or nothing)
// until well past their limit. Redis is busy, so calls go in batches; a
// decision given to the wrong call, or a batch deciding a call other than as
// it would alone, shows as a count that is not exactly the goroutine's own
// limit.
func TestBatchedCallsGetTheirOwnDecisions(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					n := int64(g%7 + 1)
					// A year-long period: the server's clock is real, and a
					// window boundary crossed during the run would reset a
					// fixed window (as it should).
					first := sluice.Limit{Rate: n, Period: 365 * 24 * time.Hour, Algorithm: a}
					second := sluice.Limit{Rate: 3 * n, Period: 365 * 24 * time.Hour, Algorithm: a}
					key := fmt.Sprintf("%s-g%d", a, g)
					takes := []sluice.Take{
						{Rule: "first", Key: key, Limit: first, Cost: 1},
						{Rule: "second", Key: key, Limit: second, Cost: 1},
					}
					out := make([]sluice.Decision, 2)
					admitted := int64(0)
					for range n + 10 {
						if err := s.Take(context.Background(), takes, out); err != nil {
							t.Error(err)
							return
						}
						if out[0].Allowed != out[1].Allowed && out[0].Allowed {
							t.Errorf("goroutine %d: one take of a call allowed, the other not: %+v", g, out)
						}
						if out[0].Allowed && out[1].Allowed {
							admitted++
						}
					}
					want := n
					if a == sluice.LeakyQueue {
						want++ // its first unit leaves at once
					}
					if admitted != want {
						t.Errorf("goroutine %d: %d admitted, want exactly %d", g, admitted, want)
					}
					// The refused calls took nothing from the second limit.
					peek := []sluice.Take{{Rule: "second", Key: key, Limit: second, Cost: 0}}
					if err := s.Take(context.Background(), peek, out[:1]); err != nil {
						t.Error(err)
						return
					}
					if rem := out[0].Remaining; rem < 3*n-want-1 || rem > 3*n-want+1 {
						t.Errorf("goroutine %d: the second limit has %d left, want about %d", g, rem, 3*n-want)
					}
				})
			}
			wg.Wait()
		})
	}
	if s.batched.Load() == 0 {
		t.Fatal("no call went in a batch: the test did not exercise batching")
	}
	t.Logf("%d calls went in batches", s.batched.Load())
}

// sendByCtx is a followed call's context (see sluice.SendBy).
type sendByCtx struct {
	context.Context
	by time.Time
}

func (c sendByCtx) SendBy() time.Time { return c.by }

// A call still queued for a batch when its caller stopped waiting for it
// (its SendBy passed) is not sent: it is answered sluice.ErrNotSent and
// applies nothing, though its context goes on (its caller listens for a
// late reply). Redis is hung while the call queues behind two calls in
// flight, then resumed.
func TestAQueuedCallPastItsSendByIsNotSent(t *testing.T) {
	srv, s, l, take := unitTaker(t)
	if err := take(context.Background(), "warm"); err != nil { // scripts loaded
		t.Fatal(err)
	}
	wg := holdTwoFlights(t, s, srv, take)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	followed := make(chan error, 1)
	go func() { followed <- take(sendByCtx{ctx, time.Now().Add(20 * time.Millisecond)}, "late") }()
	time.Sleep(100 * time.Millisecond) // queued, and past its SendBy
	srv.Resume()
	if err := <-followed; !errors.Is(err, sluice.ErrNotSent) {
		t.Fatalf("a queued call past its SendBy: %v, want ErrNotSent", err)
	}
	wg.Wait()
	out := make([]sluice.Decision, 1)
	if err := s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "late", Limit: l}}, out); err != nil || out[0].Remaining != 10 {
		t.Fatalf("the unsent call's key: %+v %v, want untouched (10 left)", out[0], err)
	}
}

// reusedCtx is a followed call's context that its engine reuses once the
// caller has gone.
type reusedCtx struct {
	context.Context
	by time.Time
}

func (c *reusedCtx) SendBy() time.Time { return c.by }

// A queued call whose caller gave up is taken out of the queue, and a
// batch never reads a call's context: the engine reuses a followed call's
// context once its caller is gone (under -race, a read shows as a race
// with the reuse below).
func TestACallThatGaveUpIsNotSentAndItsContextNotRead(t *testing.T) {
	srv, s, l, take := unitTaker(t)
	if err := take(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}
	wg := holdTwoFlights(t, s, srv, take)
	parent, cancel := context.WithCancel(context.Background())
	c := &reusedCtx{Context: parent, by: time.Now().Add(time.Hour)}
	gave := make(chan error, 1)
	go func() { gave <- take(c, "gave-up") }()
	time.Sleep(50 * time.Millisecond) // queued
	cancel()
	if err := <-gave; !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose caller gave up: %v", err)
	}
	c.by = time.Now().Add(2 * time.Hour) // reused for another call
	srv.Resume()
	wg.Wait()
	out := make([]sluice.Decision, 1)
	if err := s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "gave-up", Limit: l}}, out); err != nil || out[0].Remaining != 10 {
		t.Fatalf("the call that gave up: %+v %v, want its key untouched (10 left)", out[0], err)
	}
	queued := 0
	for _, b := range s.batchers {
		b.mu.Lock()
		queued += len(b.queue)
		b.mu.Unlock()
	}
	if queued != 0 {
		t.Fatalf("%d calls left in the queues", queued)
	}
}

// holdTwoFlights hangs srv (SIGSTOP) and makes two calls with take, which
// fill both flights of the store's batcher and wait on the hung Redis: the
// next call queues. Resume srv, then wait for the group.
func holdTwoFlights(t *testing.T, s *Store, srv *redistest.Server, take func(context.Context, string) error) *sync.WaitGroup {
	t.Helper()
	srv.Pause()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { take(context.Background(), fmt.Sprint("flight-", i)) })
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		flights := 0
		for _, b := range s.batchers {
			b.mu.Lock()
			flights += b.flights
			b.mu.Unlock()
		}
		if flights == 2 {
			return &wg
		}
		if time.Now().After(deadline) {
			srv.Resume()
			t.Fatalf("%d flights after 5 s", flights)
		}
	}
}

// unitTaker starts a Redis and a store on it, closed with the test, and
// returns them with a limit of 10 an hour and a take of one unit of it.
func unitTaker(t *testing.T) (*redistest.Server, *Store, sluice.Limit, func(ctx context.Context, key string) error) {
	t.Helper()
	srv := redistest.Start(t)
	s, err := New(Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	take := func(ctx context.Context, key string) error {
		return s.Take(ctx, []sluice.Take{{Rule: "r", Key: key, Limit: l, Cost: 1}}, make([]sluice.Decision, 1))
	}
	return srv, s, l, take
}

// Calls that carry their keys from earlier limits (sluice.Take.Was) go in
// batches like the others, each carried and decided as it would be alone:
// 64 goroutines each spend their key's first limit, then take under a
// limit three times as large naming the first, beside a rule that names
// none; each is admitted exactly the difference.
func TestBatchedCallsCarryTheirKeys(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			before := s.batched.Load()
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					n := int64(g%5 + 1)
					year := 365 * 24 * time.Hour
					first := sluice.Limit{Rate: n, Period: year, Algorithm: a}
					raised := sluice.Limit{Rate: 3 * n, Period: year, Algorithm: a}
					other := sluice.Limit{Rate: 50, Period: year, Algorithm: a} // a sliding window in Lua keeps limit x window below 2^53 µs
					key := fmt.Sprintf("%s-c%d", a, g)
					out := make([]sluice.Decision, 2)
					count := func(takes []sluice.Take, tries int64) (admitted int64) {
						for range tries {
							if err := s.Take(context.Background(), takes, out); err != nil {
								t.Error(err)
								return
							}
							if out[0].Allowed {
								admitted++
							}
						}
						return admitted
					}
					used := count([]sluice.Take{{Rule: "r", Key: key, Limit: first, Cost: 1}}, n+5)
					got := count([]sluice.Take{
						{Rule: "r", Key: key, Limit: raised, Cost: 1, Was: []sluice.Limit{first}},
						{Rule: "plain", Key: key, Limit: other, Cost: 1},
					}, 3*n+5)
					want := 3*n - n
					if a == sluice.LeakyQueue {
						used-- // its first unit leaves at once, under either limit
					}
					if used != n || got != want {
						t.Errorf("goroutine %d: %d used of %d, then %d admitted under %d, want %d", g, used, n, got, 3*n, want)
					}
				})
			}
			wg.Wait()
			t.Logf("%d calls went in batches", s.batched.Load()-before)
		})
	}
	if s.batched.Load() == 0 {
		t.Fatal("no call went in a batch: the test did not exercise batching")
	}
}

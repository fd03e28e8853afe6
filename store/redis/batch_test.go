package redis

import (
	"context"
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

package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/storecall"
)

// A rule with onSlowStore: wait is answered by the store when it is slow
// but answering, however far past the store's deadline, up to its wait:
// calls held past the 20 ms deadline and released after 100 ms admit
// exactly the limit, none degraded, where the same rule answering from its
// share admits from the share while the store still counts the calls.
func TestOnSlowStoreWaitAnswersFromTheStorePastItsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		degraded  bool
	}{
		{"wait", "rules:\n  - {id: r, key: [user], rate: 10, per: 1h, onSlowStore: {wait: 5s}}\n", false},
		{"share", "rules:\n  - {id: r, key: [user], rate: 10, per: 1h}\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := lateFixture(t, tc.src)
			for range 8 {
				f.check(t, userReq("u"))
			}
			release := slowStore(f)
			var wg sync.WaitGroup
			var admitted, degraded atomic.Int64
			for range 6 {
				wg.Go(func() {
					res := f.check(t, userReq("u"))
					if res.Allowed {
						admitted.Add(1)
					}
					if res.Degraded() {
						degraded.Add(1)
					}
				})
			}
			time.Sleep(100 * time.Millisecond) // five deadlines
			release()
			wg.Wait()
			if tc.degraded {
				if degraded.Load() == 0 {
					t.Fatal("onSlowStore: share answered no call degraded past a 20 ms deadline with the store held 100 ms")
				}
				return
			}
			if admitted.Load() != 2 || degraded.Load() != 0 || f.e.Store().Owed().Owed != 0 {
				t.Fatalf("onSlowStore: wait: %d admitted (%d degraded, %+v), want the 2 left of 10, none degraded", admitted.Load(), degraded.Load(), f.e.Store().Owed())
			}
			if d, _, err := f.e.Inspect(context.Background(), "r", "u"); err != nil || d.Remaining != 0 {
				t.Fatalf("the store has %d of 10 left (%v), want 0", d.Remaining, err)
			}
		})
	}
}

// A store that does not answer within the wait is a failed store: the rule
// then answers by its failMode, having waited no longer than its wait.
func TestOnSlowStoreWaitEndsAtItsWaitByTheFailMode(t *testing.T) {
	f := lateFixture(t, "rules:\n  - {id: r, key: [user], rate: 10, per: 1h, failMode: closed, onSlowStore: {wait: 300ms}}\n")
	f.store.mode.Store(2) // hung
	start := time.Now()
	res := f.check(t, userReq("u"))
	waited := time.Since(start)
	if res.Allowed || res.StoreError == nil || !res.Statuses[0].FailedClosed {
		t.Fatalf("a hung store past the wait: %+v, want refused as failMode closed says", res.Decision)
	}
	if waited < 300*time.Millisecond {
		t.Fatalf("answered after %v, before the rule's wait of 300 ms", waited)
	}
	// A dead store fails at once, wait or not.
	f.store.mode.Store(1)
	if res := f.check(t, userReq("u")); res.Allowed || !res.Statuses[0].FailedClosed {
		t.Fatalf("a dead store: %+v", res.Decision)
	}
}

// The wait is per rule: a request matching a waiting rule and one that
// answers from its share waits for the store (all of its takes are one
// call), and both rules' answers are the store's.
func TestOnSlowStoreWaitCoversTheWholeCall(t *testing.T) {
	f := lateFixture(t, "rules:\n  - {id: r, key: [user], rate: 10, per: 1h, onSlowStore: wait}\n  - {id: s, key: [user], rate: 100, per: 1h}\n")
	release := slowStore(f)
	done := make(chan *Result, 1)
	go func() {
		var res Result
		f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
		done <- &res
	}()
	time.Sleep(60 * time.Millisecond)
	release()
	res := <-done
	if !res.Allowed || res.Degraded() || len(res.Statuses) != 2 {
		t.Fatalf("%+v: want both rules answered by the store", res.Statuses)
	}
	for _, st := range res.Statuses {
		if st.FailedOpen || st.FailedClosed {
			t.Fatalf("%s answered degraded", st.Rule)
		}
	}
}

// A breaker opened by other rules' calls past their deadline does not
// answer for a rule that waits: while the store answers within the wait,
// such a rule's calls are sent and decided by the store, so it is never
// over (found by attack: three gateways on a Redis stalled 1.8 s, share
// traffic on other keys opening the breakers, and a spent key on a wait
// rule admitted from the share, 66 over a limit of 100).
func TestAnOpenBreakerDoesNotAnswerForARuleThatWaits(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: share, match: {path: /share}, key: [user], rate: 5, per: 1h}\n  - {id: wait, match: {path: /wait}, key: [user], rate: 5, per: 1h, onSlowStore: wait}\n", Options{Calls: storecall.Options{
		BreakerFailures: 3, BreakerOpenFor: time.Hour,
	}})
	wait := userReq("spent")
	wait.Path = "/wait"
	for range 5 {
		if res := f.check(t, wait); !res.Allowed {
			t.Fatalf("the wait rule refused within its limit: %+v", res.Decision)
		}
	}
	f.store.mode.Store(1) // the store fails: the share rule's calls open the breaker
	share := userReq("other")
	share.Path = "/share"
	for range 6 { // at least half of the calls, as the breaker counts
		f.check(t, share)
	}
	if s := f.e.Store().BreakerState(); s != "open" {
		t.Fatalf("breaker %s after 6 failures, want open", s)
	}
	f.store.mode.Store(0) // the store answers again; the breaker is still open
	calls := f.store.calls.Load()
	for range 5 {
		if res := f.check(t, wait); res.Allowed || res.StoreError != nil {
			t.Fatalf("a spent key on a wait rule with the breaker open: allowed %v, store error %v; want refused by the store", res.Allowed, res.StoreError)
		}
	}
	if f.store.calls.Load() == calls {
		t.Fatal("the wait rule's checks never reached the store")
	}
	if res := f.check(t, share); !errors.Is(res.StoreError, storecall.ErrBreakerOpen) {
		t.Fatalf("the share rule with the breaker open: %v, want answered by the breaker", res.StoreError)
	}
}

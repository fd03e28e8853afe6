package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/storecall"
)

// waitOwed checks a request of user "traffic" now and then, as traffic
// would, until nothing is owed to the store (the breaker that opened while
// the store failed lets a probe through after a second, and the first call
// that succeeds starts the write-back), or fails after 10 s.
func waitOwed(t *testing.T, f *fixture) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); f.e.Store().Owed().Owed > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still owed after 10 s: %+v", f.e.Store().Owed())
		}
		f.check(t, userReq("traffic"))
	}
}

// What a gateway admits within its share while the store fails is charged
// to the store once it answers: the store then counts every admission, and
// the window admits its limit in all, not the limit again on top of the
// degraded admissions. Without the write-back the key would admit 90 more.
func TestDegradedAdmissionsAreWrittenBack(t *testing.T) {
	src := "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n  - {id: local, key: [user], rate: 100, per: 1h, sync: local}\n"
	f := newFixture(t, src, Options{Gateways: func() int { return 4 }})
	admit := func(user string, n int) (admitted int) {
		for range n {
			if f.check(t, userReq(user)).Allowed {
				admitted++
			}
		}
		return admitted
	}
	if got := admit("u", 10); got != 10 {
		t.Fatalf("healthy: %d", got)
	}
	f.store.mode.Store(1)
	if got := admit("u", 100); got != 22 {
		t.Fatalf("degraded: %d, want 22, the part of the 90 the store said were left", got)
	}
	if o := f.e.Store().Owed(); o.Owed != 22 || o.Written != 0 {
		t.Fatalf("owed %+v, want 22 units of r (a local rule's count is not the store's)", o)
	}
	f.store.mode.Store(0)
	waitOwed(t, f)
	if o := f.e.Store().Owed(); o.Written < 22 || o.Expired != 0 || o.Overflow != 0 {
		t.Fatalf("after the store came back: %+v, want the 22 of u written", o)
	}
	if got := admit("u", 200); got != 68 {
		t.Fatalf("after the write-back: %d admitted, want 68 (100 in all over the window)", got)
	}
	// A key asked for again pays its debt with that take: 25 admitted on
	// the share, then the store admits 75, not 100.
	f.store.mode.Store(1)
	admit("v", 25) // the share
	f.store.mode.Store(0)
	if got := admit("v", 100); got != 75 {
		t.Fatalf("after 25 admitted on the share: %d, want 75", got)
	}
}

// A charge beyond what is left is a debt: the key waits it out.
func TestAWrittenBackDebtIsWaitedOut(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{})
	l := sluice.Limit{Rate: 100, Period: time.Hour}
	var res Result
	for range 95 {
		f.e.Check(context.Background(), userReq("v"), CheckOptions{}, &res)
	}
	f.e.Store().Owe("r", "v", l, 10) // 10 admitted elsewhere, 5 beyond the limit
	f.e.Store().Flush(context.Background())
	if f.check(t, userReq("v")).Allowed {
		t.Fatal("a key in debt admitted")
	}
	d, _, err := f.e.Inspect(context.Background(), "r", "v")
	if err != nil || d.Remaining != 0 || d.ResetAfter != time.Hour+3*time.Minute {
		t.Fatalf("in debt of 5 units at 100/h: %+v %v, want full for an hour and 3 minutes (5 x 36 s of debt)", d, err)
	}
}

// A request for a key whose debt is being written back waits for that
// write-back to land, then is decided on a count that holds the debt: it is
// neither admitted on a count without it nor charged it a second time.
func TestARequestWaitsForItsKeysDebtInFlight(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Calls: storecall.Options{WriteBackEvery: -1}}) // this test flushes by itself
	l := sluice.Limit{Rate: 100, Period: time.Hour}
	for range 95 {
		f.check(t, userReq("v"))
	}
	var fired atomic.Bool
	answered := make(chan *Result, 1)
	hook := func(takes []sluice.Take) {
		if len(takes) > 0 && takes[0].Charge && fired.CompareAndSwap(false, true) {
			go func() { answered <- f.check(t, userReq("v")) }() // while the charge is in flight
			time.Sleep(50 * time.Millisecond)                    // give it time to overtake, were it not to wait
		}
	}
	f.store.before.Store(&hook)
	f.e.Store().Owe("r", "v", l, 10)
	f.e.Store().Flush(context.Background())
	res := <-answered
	f.store.before.Store(nil)
	if res.Allowed {
		t.Fatal("a request during the write-back of its key's debt of 10 (on 95) was admitted")
	}
	d, _, err := f.e.Inspect(context.Background(), "r", "v")
	// 95 + 10 = 105 units: 5 of debt, 5 x 36 s beyond the hour.
	if want := time.Hour + 5*36*time.Second; err != nil || d.ResetAfter != want {
		t.Fatalf("after 95 and a debt of 10: %+v %v, want reset after %v", d, err, want)
	}
}

// A call that carries a debt and misses its deadline may still be applied
// (a hung store applies what it queued when it wakes): its debt comes back
// late, and rides on no other call until the store answers, so the waking
// store applies it once, not once per call queued during the hang. If the
// waking store's reply is lost (here: no grace for it), the debt is charged
// again once the store answers (under, never over); late_test.go has the
// reply that comes.
func TestDebtsDoNotRideOnCallsToAHungStore(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Calls: storecall.Options{
		Timeout: 20 * time.Millisecond, BreakerFailures: 1000,
		LateGrace:      -1, // calls end at their deadline: the waking store's replies are lost
		WriteBackEvery: -1, // this test flushes by itself
	}})
	for range 10 {
		f.check(t, userReq("v"))
	}
	f.store.mode.Store(1) // down: 5 admitted on the share, owed
	for range 5 {
		f.check(t, userReq("v"))
	}
	f.store.mode.Store(3) // hung: 3 calls time out, and are applied later
	for range 3 {
		f.check(t, userReq("v"))
	}
	f.store.mode.Store(0)
	if o := f.e.Store().Owed(); o.Owed != 8 {
		t.Fatalf("owed %+v, want 8: the 5 the first late call carried, and the 3 admitted on the share since", o)
	}
	f.e.Store().Flush(context.Background())
	d, _, err := f.e.Inspect(context.Background(), "r", "v")
	// 10 through the store; the 3 late calls applied (the first with the
	// 5 it carried); the 8 owed charged once: 26. A debt carried by every
	// late call would count 39.
	if err != nil || d.Remaining != 74 {
		t.Fatalf("the store counts %d, want 26: %+v %v", 100-d.Remaining, d, err)
	}
}

// A key asked for again once the store answers pays its debt in the same
// store call, before it is decided: the store never admits it on a count
// that misses its degraded admissions, even before a flush runs.
func TestADebtIsChargedWithTheKeysNextTake(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Gateways: func() int { return 4 }, Calls: storecall.Options{WriteBackEvery: -1}}) // no flush: only the takes charge
	f.store.mode.Store(1)
	admitted := 0
	for range 19 { // fewer failures than open the breaker
		if f.check(t, userReq("u")).Allowed {
			admitted++
		}
	}
	if admitted != 19 {
		t.Fatalf("degraded: %d of 19", admitted)
	}
	f.store.mode.Store(0)
	for range 200 {
		if f.check(t, userReq("u")).Allowed {
			admitted++
		}
	}
	if o := f.e.Store().Owed(); admitted != 100 || o.Owed != 0 || o.Written != 19 {
		t.Fatalf("%d admitted in all (19 while the store failed), owed %+v: want 100, the 19 written with the next take", admitted, o)
	}
}

// A gateway that serves nothing after an outage still pays what it owes
// once its heartbeat finds the store answering (StoreAnswered); one that
// stops writes back what it can, and counts the rest as dropped at
// shutdown.
func TestOwedIsWrittenBackWithoutTrafficAndAtShutdown(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Calls: storecall.Options{BreakerFailures: 1000}})
	f.store.mode.Store(1)
	for range 7 {
		f.check(t, userReq("quiet"))
	}
	if o := f.e.Store().Owed(); o.Owed != 7 {
		t.Fatalf("owed %+v, want 7", o)
	}
	f.store.mode.Store(0)
	f.e.Store().Answered()
	deadline := time.Now().Add(10 * time.Second)
	for f.e.Store().Owed().Owed != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the heartbeat's answer wrote nothing back: %+v", f.e.Store().Owed())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if o := f.e.Store().Owed(); o.Written != 7 {
		t.Fatalf("after StoreAnswered: %+v, want 7 written", o)
	}
	// At shutdown with the store up: written. With it down: dropped, counted.
	f.store.mode.Store(1)
	for range 3 {
		f.check(t, userReq("late"))
	}
	f.store.mode.Store(0)
	if w, d := f.e.Store().WriteBack(context.Background()); w != 3 || d != 0 {
		t.Fatalf("shutdown with the store up: written %d, dropped %d; want 3, 0", w, d)
	}
	f.store.mode.Store(1)
	for range 4 {
		f.check(t, userReq("later"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if w, d := f.e.Store().WriteBack(ctx); w != 0 || d != 4 || f.e.Store().Owed().Shutdown != 4 || f.e.Store().Owed().Owed != 0 {
		t.Fatalf("shutdown with the store down: written %d, dropped %d, %+v; want 0, 4 counted", w, d, f.e.Store().Owed())
	}
}

// Through the engine: with the store down, storecall.MaxOwedKeys users admitted on their
// share are owed; the next user's admission is counted unwritten
// (overflow), never charged back, and the owed ones are written back once
// the store answers. The bound is the ledger's, reached by requests.
func TestDegradedAdmissionsPastTheLedgerAreCountedUnwritten(t *testing.T) {
	if testing.Short() {
		t.Skip("65,537 degraded checks")
	}
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{Calls: storecall.Options{BreakerFailures: 1 << 30}})
	f.store.mode.Store(1)
	var res Result
	for i := range storecall.MaxOwedKeys + 1 {
		f.e.Check(context.Background(), userReq(fmt.Sprint("u", i)), CheckOptions{}, &res)
		if !res.Allowed || res.StoreError == nil {
			t.Fatalf("user %d, store down: %+v (%v), want admitted on the share", i, res.Decision, res.StoreError)
		}
	}
	if o := f.e.Store().Owed(); o.Owed != storecall.MaxOwedKeys || o.Overflow != 1 {
		t.Fatalf("%+v, want %d owed and 1 unwritten (overflow)", o, storecall.MaxOwedKeys)
	}
	f.store.mode.Store(0)
	// The write-back goes on while it makes progress: 1,024 calls of 64
	// charges, which a starved machine under -race may take minutes over.
	// The test fails only when a write-back stalls.
	for stalled, last := time.Now(), int64(-1); f.e.Store().Owed().Owed > 0; time.Sleep(5 * time.Millisecond) {
		if w := f.e.Store().Owed().Written; w != last {
			stalled, last = time.Now(), w
		}
		if time.Since(stalled) > 10*time.Second {
			t.Fatalf("the write-back wrote nothing in 10 s: %+v", f.e.Store().Owed())
		}
		f.check(t, userReq("traffic")) // a store call that kicks the write-back
	}
	if o := f.e.Store().Owed(); o.Written != storecall.MaxOwedKeys || o.Overflow != 1 {
		t.Fatalf("%+v, want %d written back and 1 unwritten", o, storecall.MaxOwedKeys)
	}
	if d, _, _ := f.e.Inspect(context.Background(), "r", fmt.Sprint("u", storecall.MaxOwedKeys)); d.Remaining != 100 {
		t.Fatalf("the overflowed user has %d left in the store, want 100: its admission is unwritten", d.Remaining)
	}
	if d, _, _ := f.e.Inspect(context.Background(), "r", "u0"); d.Remaining != 99 {
		t.Fatalf("an owed user has %d left in the store, want 99: its admission written back", d.Remaining)
	}
}

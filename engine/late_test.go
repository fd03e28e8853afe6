package engine

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
)

// lateFixture is a fixture on src whose store calls have a 20 ms deadline
// and whose breaker never opens; the test flushes the ledger itself.
func lateFixture(t *testing.T, src string) *fixture {
	t.Helper()
	f := newFixture(t, src, Options{StoreTimeout: 20 * time.Millisecond, BreakerFailures: 1000})
	f.e.client.owed.flowing.Store(true)
	t.Cleanup(func() { f.e.client.owed.flowing.Store(false) })
	return f
}

// slowStore puts f's store in mode 4: calls wait for release.
func slowStore(f *fixture) (release func()) {
	ch := make(chan struct{})
	f.store.release.Store(&ch)
	f.store.mode.Store(4)
	return func() { f.store.mode.Store(0); close(ch) }
}

// waitLate waits until n late replies have been handled (10 s at most).
func waitLate(t *testing.T, f *fixture, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		o := f.e.Store().Owed()
		if o.LateAnswered+o.LateLost+o.LateUnsent >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, %d late replies handled, want %d", o.LateAnswered+o.LateLost+o.LateUnsent, n)
		}
	}
}

// stored is what the store counts for key v of rule r (100 per hour).
func stored(t *testing.T, f *fixture, key string) int64 {
	t.Helper()
	d, _, err := f.e.Inspect(context.Background(), "r", key)
	if err != nil {
		t.Fatal(err)
	}
	return 100 - d.Remaining
}

// A store that is only slow applies a call that missed its deadline. The
// gateway answered it from its share and owed what it admitted; the late
// reply credits what the store counted, so each admission is counted once
// (before, twice: once applied, once written back). The charges a late
// call carried are credited too: written once, not owed again. Nothing
// else is credited: a shadow rule's count (its failure owed nothing) and a
// local rule's (its count is not the store's) stand as the reply left them.
func TestALateReplyIsNotCountedTwice(t *testing.T) {
	src := "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n" +
		"  - {id: s, key: [user], rate: 100, per: 1h, mode: shadow}\n" +
		"  - {id: local, key: [user], rate: 100, per: 1h, sync: local}\n"
	f := lateFixture(t, src)
	for range 10 {
		f.check(t, userReq("v"))
	}
	f.store.mode.Store(1) // down: 5 admitted on the share, owed
	for range 5 {
		if !f.check(t, userReq("v")).Allowed {
			t.Fatal("refused on the share")
		}
	}
	f.e.client.answering.Store(true) // as if a call of another key had just succeeded: debts ride
	release := slowStore(f)
	for i := range 3 { // late: each admitted on the share and owed; the first carries the 5
		res := f.check(t, userReq("v"))
		if !res.Allowed || res.StoreError == nil {
			t.Fatalf("late call %d: %+v, want admitted on the share", i, res.Decision)
		}
	}
	if o := f.e.Store().Owed(); o.Owed != 8 {
		t.Fatalf("owed %+v, want 8 while the late calls are out", o)
	}
	release()
	waitLate(t, f, 6) // 3 calls of the enforced rules, 3 of the shadow rule
	o := f.e.Store().Owed()
	if o.Owed != 0 || o.Credit != 0 || o.LateAnswered != 6 {
		t.Fatalf("after the late replies: %+v, want nothing owed: each applied its take and the first its 5", o)
	}
	f.e.client.owed.flush(context.Background(), f.e.client, time.Now())
	// 10 + 5 + 3 admitted; the store counts each once.
	if got := stored(t, f, "v"); got != 18 {
		t.Fatalf("the store counts %d, want 18 (26 when the late calls are counted twice)", got)
	}
}

// A late reply for a key whose degraded answer was a refusal (here a
// fail-closed rule) gives back what the store counted: a refund, written
// back like a debt. So is a credit that comes after its debt was charged.
func TestALateReplyRefundsWhatTheGatewayRefused(t *testing.T) {
	f := lateFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h, failMode: closed}\n")
	for range 10 {
		f.check(t, userReq("w"))
	}
	release := slowStore(f)
	for range 4 {
		if res := f.check(t, userReq("w")); res.Allowed || res.Decision.Reason != sluice.ReasonUnavailable {
			t.Fatalf("fail-closed while the store is slow: %+v", res.Decision)
		}
	}
	release()
	waitLate(t, f, 4)
	if o := f.e.Store().Owed(); o.Credit != 4 || o.Owed != 0 {
		t.Fatalf("after the late replies: %+v, want 4 units to give back", o)
	}
	if got := stored(t, f, "w"); got != 14 {
		t.Fatalf("before the refund the store counts %d, want 14", got)
	}
	f.e.client.owed.flush(context.Background(), f.e.client, time.Now())
	if o := f.e.Store().Owed(); o.Credit != 0 || o.Refunded != 4 {
		t.Fatalf("after the write-back: %+v, want the 4 refunded", o)
	}
	if got := stored(t, f, "w"); got != 10 {
		t.Fatalf("the store counts %d, want the 10 admitted", got)
	}
}

// A debt and a credit of one key net out in either order, and the entry
// goes when they do; a lone credit is written back as a refund.
func TestACreditAndItsDebtNetInEitherOrder(t *testing.T) {
	l := sluice.Limit{Rate: 100, Period: time.Hour}
	var o owed
	now := time.Now()
	o.owe("r", "a", l, 3, now, true)
	o.owe("r", "a", l, -3, now, false)
	o.owe("r", "b", l, -2, now, false)
	o.owe("r", "b", l, 2, now, false)
	o.owe("r", "c", l, -1, now, false)
	if len(o.debts) != 1 || o.debts[owedKey{"r", "c"}] == nil || !o.pending.Load() {
		t.Fatalf("ledger %v, want only c's credit, pending", o.debts)
	}
	if charges, _ := o.claim([]sluice.Take{{Rule: "r", Key: "c", Limit: l, Cost: 1}}, true); len(charges) != 0 {
		t.Fatalf("a request rode a credit: %+v", charges)
	}
}

// Graced calls are bounded: past maxGraced at once, a call ends at its
// deadline as before, and the count of running calls goes back to zero.
func TestGracedCallsAreBounded(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n", Options{StoreTimeout: 20 * time.Millisecond, BreakerFailures: 1 << 20})
	f.e.client.workers.n.Store(maxGraced) // as if maxGraced workers were busy
	release := slowStore(f)
	res := f.check(t, userReq("x"))
	release()
	if res.StoreError == nil || f.e.Store().Owed().LateAnswered != 0 {
		t.Fatalf("a call past the bound: %+v", f.e.Store().Owed())
	}
	time.Sleep(10 * time.Millisecond)
	if o := f.e.Store().Owed(); o.LateAnswered+o.LateLost != 0 {
		t.Fatalf("a call past the bound was graced: %+v", o)
	}
	if n := f.e.client.workers.n.Load(); n != maxGraced {
		t.Fatalf("%d workers counted after a call past the bound, want %d: the count drifts", n, maxGraced)
	}
	// One below the bound, a call is still followed: the bound is
	// maxGraced workers, not one less.
	f.e.client.workers.n.Store(maxGraced - 1)
	release = slowStore(f)
	f.check(t, userReq("x"))
	release()
	waitLate(t, f, 1)
	if o := f.e.Store().Owed(); o.LateAnswered != 1 {
		t.Fatalf("the call that made maxGraced workers was not followed: %+v", o)
	}
	for deadline := time.Now().Add(10 * time.Second); f.e.client.workers.n.Load() != maxGraced-1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers after the followed call ended, want %d", f.e.client.workers.n.Load(), maxGraced-1)
		}
	}
	// Calls one after another, each made once the last one's worker has
	// parked, run on that one worker: a parked worker is taken, not a new
	// one started. (Whether a worker parks before the next call arrives is
	// the scheduler's business, so the test waits for it.) The worker,
	// done, counts itself idle once: a dispatcher's claim takes exactly one
	// idle worker, so idle never drifts from the truth.
	f.e.client.workers.n.Store(0)
	for call := range 5 {
		f.check(t, userReq("x"))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			running, idle := f.e.Store().Workers()
			if running == 1 && idle == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after call %d: %d workers, %d idle; want 1 and 1", call+1, running, idle)
			}
		}
	}
}

// A late reply that refused (the key was at its limit) counted nothing,
// and a reply that never comes within the grace (or an error) tells
// nothing: the ledger stays as the deadline left it, and the debts the
// call carried are owed again.
func TestALateRefusalOrALostReplyCreditsNothing(t *testing.T) {
	f := lateFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n")
	for range 100 {
		f.check(t, userReq("full"))
	}
	release := slowStore(f)
	if res := f.check(t, userReq("full")); res.Allowed || res.StoreError == nil {
		t.Fatalf("a full key while the store is slow: %+v", res.Decision) // its share is spent by the mirror
	}
	release()
	waitLate(t, f, 1)
	if o := f.e.Store().Owed(); o.Credit != 0 || o.Owed != 0 || o.LateAnswered != 1 {
		t.Fatalf("after a late refusal: %+v, want nothing credited", o)
	}

	// A grace of several reaper rounds (100 ms each): the reaper goes on
	// while a call is still within its grace, and closes it after.
	f.e.client.lateGrace = 350 * time.Millisecond
	f.store.mode.Store(1) // down: 5 admitted on the share, owed
	for range 5 {
		f.check(t, userReq("v"))
	}
	f.e.client.answering.Store(true)
	f.store.mode.Store(2) // hung past the grace: the reply never comes
	if res := f.check(t, userReq("v")); !res.Allowed {
		t.Fatalf("refused on the share: %+v", res.Decision)
	}
	waitLate(t, f, 2)
	if o := f.e.Store().Owed(); o.Owed != 6 || o.Credit != 0 || o.LateLost != 1 {
		t.Fatalf("after a lost reply: %+v, want the 5 carried and 1 admitted owed", o)
	}
}

// A call a store queued and did not send once its caller stopped waiting
// (sluice.SendBy) applied nothing: no credit, and what it carried stays
// owed.
func TestAnUnsentCallIsNotCredited(t *testing.T) {
	f := lateFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n")
	f.store.mode.Store(1)
	for range 5 {
		f.check(t, userReq("v"))
	}
	f.e.client.answering.Store(true)
	release := slowStore(f)
	f.store.mode.Store(5)
	if res := f.check(t, userReq("v")); !res.Allowed {
		t.Fatalf("refused on the share: %+v", res.Decision)
	}
	release()
	waitLate(t, f, 1)
	if o := f.e.Store().Owed(); o.LateUnsent != 1 || o.Owed != 6 || o.Credit != 0 {
		t.Fatalf("after an unsent call: %+v, want it counted unsent, and the 5 it carried and 1 admitted owed", o)
	}
}

// A write-back that gives a credit back (a refund) and misses its deadline
// owes it back again; if its late reply shows it applied, that is
// cancelled: the store is refunded once, not twice (twice would let the key
// admit more than its limit).
func TestALateRefundIsNotGivenTwice(t *testing.T) {
	f := lateFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n")
	for range 10 {
		f.check(t, userReq("w"))
	}
	l := sluice.Limit{Rate: 100, Period: time.Hour}
	f.e.client.owed.owe("r", "w", l, -3, time.Now(), false) // 3 the store counted and the gateway refused
	release := slowStore(f)
	f.e.client.owed.flush(context.Background(), f.e.client, time.Now()) // misses its deadline: owed back again
	if o := f.e.Store().Owed(); o.Credit != 3 {
		t.Fatalf("after a refund that missed its deadline: %+v, want 3 to give back still", o)
	}
	release()
	waitLate(t, f, 1)
	if o := f.e.Store().Owed(); o.Credit != 0 || o.Owed != 0 {
		t.Fatalf("after the refund's late reply: %+v, want nothing left to give back", o)
	}
	f.e.client.owed.flush(context.Background(), f.e.client, time.Now())
	if got := stored(t, f, "w"); got != 7 {
		t.Fatalf("the store counts %d, want 7 (10 less 3, refunded once)", got)
	}
}

// A countOn charge that misses its deadline while this gateway's share is
// spent is still owed (the request was served), so the late reply that
// applied it cancels a debt rather than leaving a credit: the store counts
// every failure once.
func TestALateChargeWithTheShareSpentIsCountedOnce(t *testing.T) {
	src := "rules:\n  - {id: r, match: {path: /login}, key: [user], rate: 100, per: 1h, countOn: {status: [401]}}\n"
	f := newFixture(t, src, Options{StoreTimeout: 20 * time.Millisecond, BreakerFailures: 1000, Gateways: func() int { return 4 }})
	f.e.client.owed.flowing.Store(true)
	t.Cleanup(func() { f.e.client.owed.flowing.Store(false) })
	req := func() *rules.Request { r := userReq("u"); r.Path = "/login"; return r }
	for range 25 { // charged through the store and mirrored: the share of 25 is spent
		f.e.Charge(context.Background(), f.check(t, req()), 401)
	}
	res := f.check(t, req()) // the store, with 75 left, admits
	if !res.Allowed {
		t.Fatalf("the 26th attempt: %+v", res.Decision)
	}
	release := slowStore(f)
	f.e.Charge(context.Background(), res, 401) // past its deadline
	release()
	waitLate(t, f, 1)
	f.e.client.owed.flush(context.Background(), f.e.client, time.Now())
	if o := f.e.Store().Owed(); o.Owed != 0 || o.Credit != 0 {
		t.Fatalf("after the late reply and a flush: %+v, want nothing owed or credited", o)
	}
	if d, _, _ := f.e.Inspect(context.Background(), "r", "u"); d.Remaining != 100-26 {
		t.Fatalf("the store counts %d failures, want the 26 served", 100-d.Remaining)
	}
}

// The ledger keeps its own copy of a key: the keys it is handed are views
// into a request's reused buffer, and a debt kept under the view would be
// written back under whatever the next request put there.
func TestTheLedgerKeepsItsOwnCopyOfAKey(t *testing.T) {
	l := sluice.Limit{Rate: 100, Period: time.Hour}
	var o owed
	buf := []byte("user-a")
	o.owe("r", unsafe.String(&buf[0], len(buf)), l, 2, time.Now(), false)
	copy(buf, "user-b") // the buffer's next request
	if d := o.debts[owedKey{"r", "user-a"}]; d == nil || d.units != 2 {
		t.Fatalf("ledger %v: the debt of user-a is not under user-a", o.debts)
	}
	if d := o.debts[owedKey{"r", "user-b"}]; d != nil {
		t.Fatalf("ledger %v: user-b owes what user-a was admitted", o.debts)
	}
}

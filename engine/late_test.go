package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// lateFixture is a fixture on src whose store calls have a 20 ms deadline
// and whose breaker never opens; the test flushes the ledger itself (no
// write-back of the client's own).
func lateFixture(t *testing.T, src string) *fixture {
	t.Helper()
	return newFixture(t, src, Options{Calls: storecall.Options{Timeout: 20 * time.Millisecond, BreakerFailures: 1000, WriteBackEvery: -1}})
}

// answering has the store answer a call of a key of its own, as traffic
// would once it is back: debts then ride on the calls that follow.
func answering(t *testing.T, f *fixture) {
	t.Helper()
	mode := f.store.mode.Swap(0)
	if res := f.check(t, userReq("traffic")); res.StoreError != nil {
		t.Fatalf("the store did not answer: %v", res.StoreError)
	}
	f.store.mode.Store(mode)
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
	answering(t, f) // a call of another key succeeds: debts ride
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
	f.e.Store().Flush(context.Background())
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
	f.e.Store().Flush(context.Background())
	if o := f.e.Store().Owed(); o.Credit != 0 || o.Refunded != 4 {
		t.Fatalf("after the write-back: %+v, want the 4 refunded", o)
	}
	if got := stored(t, f, "w"); got != 10 {
		t.Fatalf("the store counts %d, want the 10 admitted", got)
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
	f = newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h}\n",
		Options{Calls: storecall.Options{Timeout: 20 * time.Millisecond, BreakerFailures: 1000, WriteBackEvery: -1, LateGrace: 350 * time.Millisecond}})
	f.store.mode.Store(1) // down: 5 admitted on the share, owed
	for range 5 {
		f.check(t, userReq("v"))
	}
	answering(t, f)
	f.store.mode.Store(2) // hung past the grace: the reply never comes
	if res := f.check(t, userReq("v")); !res.Allowed {
		t.Fatalf("refused on the share: %+v", res.Decision)
	}
	waitLate(t, f, 1)
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
	answering(t, f)
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
	f.e.Store().Owe("r", "w", l, -3) // 3 the store counted and the gateway refused
	release := slowStore(f)
	f.e.Store().Flush(context.Background()) // misses its deadline: owed back again
	if o := f.e.Store().Owed(); o.Credit != 3 {
		t.Fatalf("after a refund that missed its deadline: %+v, want 3 to give back still", o)
	}
	release()
	waitLate(t, f, 1)
	if o := f.e.Store().Owed(); o.Credit != 0 || o.Owed != 0 {
		t.Fatalf("after the refund's late reply: %+v, want nothing left to give back", o)
	}
	f.e.Store().Flush(context.Background())
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
	f := newFixture(t, src, Options{Calls: storecall.Options{Timeout: 20 * time.Millisecond, BreakerFailures: 1000, WriteBackEvery: -1}, Gateways: func() int { return 4 }})
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
	f.e.Store().Flush(context.Background())
	if o := f.e.Store().Owed(); o.Owed != 0 || o.Credit != 0 {
		t.Fatalf("after the late reply and a flush: %+v, want nothing owed or credited", o)
	}
	if d, _, _ := f.e.Inspect(context.Background(), "r", "u"); d.Remaining != 100-26 {
		t.Fatalf("the store counts %d failures, want the 26 served", 100-d.Remaining)
	}
}

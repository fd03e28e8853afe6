package storecall

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-rl/sluice"
)

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

// The ledger is bounded: debts past their period are dropped, not charged
// (the store's own count of that time has emptied too), and past MaxOwedKeys
// keys an admission is counted unwritten.
func TestOwedDebtsExpireAndAreBounded(t *testing.T) {
	// A generous deadline: the write-back of 4,097 debts is several calls,
	// and on a busy machine one could miss a default deadline, leaving its
	// debts for the next try, which this test does not wait for.
	c, s := newClient(t, Options{Timeout: time.Minute})
	l := hourly
	now := time.Now()
	c.owed.owe("r", "old", l, 3, now.Add(-2*time.Hour), false)
	c.owed.owe("r", "new", l, 2, now, false)
	c.owed.flush(context.Background(), c, now)
	if o := c.Owed(); o.Expired != 3 || o.Written != 2 || o.Owed != 0 {
		t.Fatalf("%+v, want 3 expired, 2 written", o)
	}
	for i := range MaxOwedKeys {
		c.owed.owe("r", fmt.Sprint("k", i), l, 1, now, false)
	}
	c.owed.owe("r", "one-too-many", l, 7, now, false)
	c.owed.owe("r", "k1", l, 1, now, false) // an owed key still adds up
	if o := c.Owed(); o.Overflow != 7 || o.Owed != MaxOwedKeys+1 {
		t.Fatalf("%+v, want 7 overflowed and %d owed", o, MaxOwedKeys+1)
	}
	// A failing store keeps the debts for the next try.
	s.mode.Store(1)
	c.owed.flush(context.Background(), c, now)
	if o := c.Owed(); o.Owed != MaxOwedKeys+1 {
		t.Fatalf("a failed write-back lost debts: %+v", o)
	}
	s.mode.Store(0)
	c.owed.flush(context.Background(), c, now)
	if o := c.Owed(); o.Owed != 0 || o.Written != 2+MaxOwedKeys+1 {
		t.Fatalf("%+v", o)
	}
}

// The ledger's edges, step by step: pending says whether anything is owed
// or in flight (a debt netted to zero by its credit leaves nothing); a debt
// exactly one period old is dropped; a batch boards at most maxChargeBatch
// debts; a take of cost 0 carries its key's debt, a dry run does not.
func TestTheLedgersEdges(t *testing.T) {
	c, _ := newClient(t, Options{})
	o := &c.owed
	l := hourly
	now := time.Now()
	o.owe("r", "a", l, 1, now, false)
	o.owe("r", "b", l, 1, now, false)
	o.owe("r", "b", l, -1, now, true) // b's credit: b nets to zero
	if !o.pending.Load() {
		t.Fatal("a is owed, but nothing is pending")
	}
	o.owe("r", "a", l, -1, now, true)
	if o.pending.Load() || len(o.debts) != 0 {
		t.Fatalf("everything netted to zero, yet pending (%d debts)", len(o.debts))
	}

	o.owe("r", "old", l, 3, now.Add(-time.Hour), false)
	if takes, _, _ := o.board(c, now); len(takes) != 0 || c.Owed().Expired != 3 {
		t.Fatalf("a debt of exactly one period: boarded %d, expired %d; want dropped", len(takes), c.Owed().Expired)
	}

	for i := range maxChargeBatch + 1 {
		o.owe("r", fmt.Sprint("k", i), l, 1, now, false)
	}
	takes, _, landed := o.board(c, now)
	if len(takes) != maxChargeBatch || len(o.debts) != 1 {
		t.Fatalf("boarded %d of %d debts, %d left; want %d", len(takes), maxChargeBatch+1, len(o.debts), maxChargeBatch)
	}
	o.land(takes, landed)
	if !o.pending.Load() {
		t.Fatal("one debt left after a batch landed, yet nothing pending")
	}
	clear(o.debts)

	o.owe("r", "z", l, 2, now, false)
	if charges, _ := o.claim([]sluice.Take{{Rule: "r", Key: "z", Limit: l, DryRun: true}}, true); len(charges) != 0 {
		t.Fatalf("a dry run claimed %v", charges)
	}
	if charges, _ := o.claim([]sluice.Take{{Rule: "r", Key: "z", Limit: l}}, true); len(charges) != 1 || charges[0].Cost != 2 {
		t.Fatalf("a take of cost 0 claimed %v, want the key's debt of 2", charges)
	}
}

// A flush is started at most every flushEvery.
func TestKickStartsAFlushAtMostEveryFlushEvery(t *testing.T) {
	c, _ := newClient(t, Options{WriteBackEvery: flushEvery})
	o := &c.owed
	o.owe("r", "a", hourly, 1, time.Now(), false)
	just := time.Now().UnixNano()
	o.last.Store(just)
	o.kick(c)
	if o.last.Load() != just {
		t.Fatal("a flush was started just after another")
	}
	o.last.Store(just - int64(flushEvery))
	o.kick(c)
	if o.last.Load() == just-int64(flushEvery) {
		t.Fatal("no flush was started a flushEvery after the last")
	}
	for deadline := time.Now().Add(10 * time.Second); c.Owed().Owed > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the flush wrote nothing back in 10 s: %+v", c.Owed())
		}
	}
}

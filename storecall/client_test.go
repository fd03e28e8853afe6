package storecall

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// testStore wraps the embedded store (hidden, so that the client guards
// it as a remote one) and fails or stalls on demand.
type testStore struct {
	inner sluice.Store
	mode  atomic.Int32 // 0 ok, 1 fail, 2 stall until the call's context ends, 4 hold until released
	// release, in mode 4, is closed by the test to let the held calls
	// through: applied and answered, after their deadline.
	release atomic.Pointer[chan struct{}]
}

func (s *testStore) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	switch s.mode.Load() {
	case 1:
		return errDown
	case 2:
		<-ctx.Done()
		return ctx.Err()
	case 4:
		select {
		case <-*s.release.Load():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.inner.Take(ctx, takes, out)
}

// hold puts s in mode 4: calls wait for the release it returns.
func (s *testStore) hold() (release func()) {
	ch := make(chan struct{})
	s.release.Store(&ch)
	s.mode.Store(4)
	return func() { s.mode.Store(0); close(ch) }
}

// newClient is a client of a fresh testStore with o, whose write-backs
// run only when a test flushes (a negative WriteBackEvery), unless o says
// otherwise.
func newClient(t *testing.T, o Options) (*Client, *testStore) {
	t.Helper()
	s := &testStore{inner: memory.New()}
	if o.WriteBackEvery == 0 {
		o.WriteBackEvery = -1
	}
	return New(s, nil, o), s
}

var hourly = sluice.Limit{Rate: 100, Period: time.Hour}

// take makes a plain call of one unit of key under rule r at 100 an hour.
func take(c *Client, key string) (sluice.Decision, error) {
	var out [1]sluice.Decision
	err := c.Take(context.Background(), Call{}, []sluice.Take{{Rule: "r", Key: key, Limit: hourly, Cost: 1}}, out[:])
	return out[0], err
}

// left is what the store has left of key under r.
func left(t *testing.T, s *testStore, key string) int64 {
	t.Helper()
	var out [1]sluice.Decision
	if err := s.inner.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: hourly}}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0].Remaining
}

// waitLate waits until n late replies have been handled (10 s at most).
func waitLate(t *testing.T, c *Client, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		o := c.Owed()
		if o.LateAnswered+o.LateLost+o.LateUnsent >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, %d late replies handled, want %d", o.LateAnswered+o.LateLost+o.LateUnsent, n)
		}
	}
}

// A store that never blocks is called as it is: no deadline, no breaker,
// no worker; a remote one is guarded.
func TestAnEmbeddedStoreIsCalledAsItIs(t *testing.T) {
	c := New(memory.New(), nil, Options{})
	if c.Guarded() || !c.Reached() {
		t.Fatalf("embedded: guarded %v, reached %v", c.Guarded(), c.Reached())
	}
	var spent time.Duration
	var out [1]sluice.Decision
	if err := c.Take(context.Background(), Call{Spent: &spent}, []sluice.Take{{Rule: "r", Key: "k", Limit: hourly, Cost: 1}}, out[:]); err != nil || !out[0].Allowed || out[0].Remaining != 99 {
		t.Fatalf("%+v %v", out[0], err)
	}
	if running, _ := c.Workers(); running != 0 || spent != 0 {
		t.Fatalf("an embedded call ran on %d workers and counted %v spent", running, spent)
	}
	r, s := newClient(t, Options{})
	if !r.Guarded() || r.Reached() {
		t.Fatalf("remote, before any call: guarded %v, reached %v", r.Guarded(), r.Reached())
	}
	if _, err := take(r, "k"); err != nil || !r.Reached() {
		t.Fatalf("after a call: %v, reached %v", err, r.Reached())
	}
	s.mode.Store(1)
	if _, err := take(r, "k"); err == nil {
		t.Fatal("a failing store's call did not fail")
	}
	if err := r.Take(context.Background(), Call{Spent: &spent}, []sluice.Take{{Rule: "r", Key: "k", Limit: hourly}}, out[:]); err == nil || spent <= 0 {
		t.Fatalf("a remote call: %v, %v spent", err, spent)
	}
}

// An owing call carries the debts of its keys, charged before its own takes
// in one atomic call; a plain call carries none.
func TestAnOwingCallCarriesItsKeysDebts(t *testing.T) {
	c, s := newClient(t, Options{})
	c.Owe("r", "k", hourly, 5)
	c.Owe("r", "other", hourly, 2)
	if _, err := take(c, "k"); err != nil {
		t.Fatal(err)
	}
	if got := left(t, s, "k"); got != 99 {
		t.Fatalf("a plain call carried a debt: %d left, want 99", got)
	}
	var out [1]sluice.Decision
	if err := c.Take(context.Background(), Call{Owing: true}, []sluice.Take{{Rule: "r", Key: "k", Limit: hourly, Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if got := left(t, s, "k"); got != 93 || out[0].Remaining != 93 {
		t.Fatalf("an owing call: %d left (answered %d), want 93: its debt of 5 charged first", got, out[0].Remaining)
	}
	if o := c.Owed(); o.Owed != 2 || o.Written != 5 {
		t.Fatalf("%+v, want 2 owed (another key's) and 5 written", o)
	}
	c.Flush(context.Background())
	if o := c.Owed(); o.Owed != 0 || o.Written != 7 || left(t, s, "other") != 98 {
		t.Fatalf("after a flush: %+v, other has %d left", o, left(t, s, "other"))
	}
}

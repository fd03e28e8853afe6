package share

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// fakeSet is an in-process heartbeat set with expiry, failing on demand.
type fakeSet struct {
	mu   sync.Mutex
	exp  map[string]time.Time
	down bool
}

func (f *fakeSet) Heartbeat(_ context.Context, id string, ttl time.Duration) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return 0, errors.New("down")
	}
	now := time.Now()
	f.exp[id] = now.Add(ttl)
	n := 0
	for _, e := range f.exp {
		if e.After(now) {
			n++
		}
	}
	return n, nil
}

func (f *fakeSet) Leave(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.exp, id)
	return nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestMembershipCountsLiveGatewaysAndKeepsTheLastCountWhileDown(t *testing.T) {
	set := &fakeSet{exp: map[string]time.Time{}}
	ms := []*Membership{
		NewMembership(set, "a", time.Hour, 0, quiet),
		NewMembership(set, "b", time.Hour, 0, quiet),
		NewMembership(set, "c", time.Hour, 0, quiet),
	}
	for _, m := range ms {
		m.beat(context.Background())
	}
	ms[0].beat(context.Background())
	if n := ms[0].Gateways(); n != 3 {
		t.Fatalf("%d gateways, want 3", n)
	}
	set.mu.Lock()
	set.down = true
	set.mu.Unlock()
	ms[0].beat(context.Background())
	if n := ms[0].Gateways(); n != 3 {
		t.Fatalf("while the store is down: %d gateways, want the last count, 3", n)
	}
	set.mu.Lock()
	set.down = false
	set.mu.Unlock()
	ms[2].h.Leave(context.Background(), "c")
	ms[0].beat(context.Background())
	if n := ms[0].Gateways(); n != 2 {
		t.Fatalf("after one left: %d, want 2", n)
	}
	if n := NewMembership(set, "d", time.Hour, 5, quiet).Gateways(); n != 5 {
		t.Fatalf("fixed count: %d", n)
	}
}

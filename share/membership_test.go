package share

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
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
	const every = 200 * time.Millisecond
	set := &fakeSet{exp: map[string]time.Time{}}
	ms := []*Membership{
		NewMembership(set, "a", every, 0, quiet),
		NewMembership(set, "b", every, 0, quiet),
		NewMembership(set, "c", every, 0, quiet),
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
	// Just after the store answers again, the others may not have beaten
	// yet: the count does not shrink for two periods.
	ms[0].beat(context.Background())
	if n := ms[0].Gateways(); n != 3 {
		t.Fatalf("just after the store came back: %d, want still 3", n)
	}
	time.Sleep(2 * every) // not a timing assertion: the grace must pass
	ms[1].beat(context.Background())
	ms[0].beat(context.Background())
	if n := ms[0].Gateways(); n != 2 {
		t.Fatalf("two periods on, after one left: %d, want 2", n)
	}
	if n := NewMembership(set, "d", time.Hour, 5, quiet).Gateways(); n != 5 {
		t.Fatalf("fixed count: %d", n)
	}
}

// ttlSet answers a fixed count and records the time to live each heartbeat
// asked for.
type ttlSet struct {
	mu   sync.Mutex
	n    int
	ttls []time.Duration
}

func (s *ttlSet) Heartbeat(_ context.Context, _ string, ttl time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ttls = append(s.ttls, ttl)
	return s.n, nil
}

func (s *ttlSet) Leave(context.Context, string) error { return nil }

// A heartbeat lives three beats (3 s by default, when no period is given);
// the count is logged when first read and when it changes, not on every
// beat.
func TestMembershipHeartbeatLifetimeAndLogLines(t *testing.T) {
	set := &ttlSet{n: 2}
	NewMembership(set, "g", 0, 0, quiet).beat(t.Context())
	var buf syncBuffer
	m := NewMembership(set, "g", 20*time.Millisecond, 0, slog.New(slog.NewTextHandler(&buf, nil)))
	m.beat(t.Context())
	m.beat(t.Context())
	set.n = 3
	m.beat(t.Context())
	if len(set.ttls) != 4 || set.ttls[0] != 3*time.Second || set.ttls[1] != 60*time.Millisecond {
		t.Fatalf("heartbeat lifetimes %v, want 3s by default and three beats of 20ms (60ms)", set.ttls)
	}
	if got := strings.Count(buf.String(), "gateways sharing the store"); got != 2 || m.Gateways() != 3 {
		t.Fatalf("%d log lines for counts 2, 2, 3 (want 2: the first and the change); gateways %d\n%s", got, m.Gateways(), buf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

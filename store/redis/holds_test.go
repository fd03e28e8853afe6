package redis_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// Reservations across processes on a real cluster: one store opens them,
// another settles them, and a reservation whose call another slot refused
// was never opened (the give-back deletes it with the units).
func TestReservationsAcrossProcessesAndSlots(t *testing.T) {
	url := redistest.StartCluster(t).URL()
	prefix := fmt.Sprintf("h%d:", prefixes.Add(1))
	open := func() *redis.Store {
		s, err := redis.New(redis.Options{URL: url, Prefix: prefix}) // the server's clock
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a, b := open(), open()
	ctx := context.Background()
	l := sluice.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	do := func(s *redis.Store, takes ...sluice.Take) []sluice.Decision {
		t.Helper()
		out := make([]sluice.Decision, len(takes))
		if err := s.Take(ctx, takes, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Keys in different slots: the tag is the key.
	if d := do(a, sluice.Take{Rule: "tokens", Key: "alice", Limit: l, Cost: 300, Hold: "r1", HoldFor: time.Minute}); !d[0].Allowed {
		t.Fatalf("reserve: %+v", d[0])
	}
	d := do(b, sluice.Take{Rule: "tokens", Key: "alice", Limit: l, Cost: 120, Hold: "r1", Settle: true})
	if !d[0].Allowed || d[0].Remaining != 880 {
		t.Fatalf("settle 120 of 300 in another process: %+v, want 880 remaining", d[0])
	}
	if d := do(a, sluice.Take{Rule: "tokens", Key: "alice", Limit: l, Cost: 120, Hold: "r1", Settle: true}); d[0].Reason != sluice.ReasonNoReservation {
		t.Fatalf("second settle: %+v", d[0])
	}

	do(a, sluice.Take{Rule: "tokens", Key: "bob-full", Limit: l, Cost: 1000})
	out := do(a,
		sluice.Take{Rule: "tokens", Key: "carol", Limit: l, Cost: 50, Hold: "r2", HoldFor: time.Minute},
		sluice.Take{Rule: "tokens", Key: "bob-full", Limit: l, Cost: 1},
	)
	if out[1].Allowed {
		t.Fatalf("the full key admitted: %+v", out[1])
	}
	if d := do(b, sluice.Take{Rule: "tokens", Key: "carol", Limit: l, Cost: 0, Hold: "r2", Settle: true}); d[0].Reason != sluice.ReasonNoReservation || d[0].Remaining != 1000 {
		t.Fatalf("a reservation in a refused call: %+v, want no reservation and 1000 remaining", d[0])
	}

	// A settle beyond the limit puts the key in debt, visible to both.
	do(a, sluice.Take{Rule: "tokens", Key: "dave", Limit: l, Cost: 10, Hold: "r3", HoldFor: time.Minute})
	do(b, sluice.Take{Rule: "tokens", Key: "dave", Limit: l, Cost: 1500, Hold: "r3", Settle: true})
	if d := do(a, sluice.Take{Rule: "tokens", Key: "dave", Limit: l, Cost: 1}); d[0].Allowed || d[0].RetryAfter < 1800*time.Second {
		t.Fatalf("in debt of 500 at 1000/h: %+v, want refused for over 30 minutes", d[0])
	}
	if err := a.Take(ctx, []sluice.Take{{Rule: "tokens", Key: "e", Limit: l, Cost: 1, Hold: string(make([]byte, sluice.MaxHoldLen+1)), HoldFor: time.Minute}}, make([]sluice.Decision, 1)); err == nil {
		t.Fatal("an overlong reservation id was accepted")
	}
}

// A settle at an absurd cost is a debt that never ends, not a store error
// (which would count towards the circuit breaker).
func TestAHugeSettleIsADebtNotAnError(t *testing.T) {
	s, err := redis.New(redis.Options{URL: redistest.Start(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Rate: 100000, Period: 24 * time.Hour, Algorithm: a}
		if a.IsBucket() {
			l.Burst = 100000
		}
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1, Hold: "h", HoldFor: time.Minute}}, out); err != nil {
			t.Fatal(err)
		}
		if err := s.Take(ctx, []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1 << 62, Hold: "h", Settle: true}}, out); err != nil || !out[0].Allowed {
			t.Fatalf("%v: settle at 2^62: %v %+v", a, err, out[0])
		}
		if err := s.Take(ctx, []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1}}, out); err != nil || out[0].Allowed {
			t.Fatalf("%v: after a huge settle: %v %+v", a, err, out[0])
		}
	}
}

// One take against a reservation and its settle, on a real redis-server:
// the reservation costs one more key write, the settle one script call.
func BenchmarkReserveAndSettle(b *testing.B) {
	s, err := redis.New(redis.Options{URL: redistest.Start(b).URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := sluice.Limit{Rate: 1000000, Period: time.Second, Burst: 1 << 20}
	out := make([]sluice.Decision, 1)
	for _, mode := range []string{"take", "reserve+settle"} {
		b.Run("op="+mode, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				tk := sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 10}
				if mode == "take" {
					if err := s.Take(ctx, []sluice.Take{tk}, out); err != nil {
						b.Fatal(err)
					}
					continue
				}
				tk.Hold, tk.HoldFor = strconv.Itoa(i), time.Minute
				if err := s.Take(ctx, []sluice.Take{tk}, out); err != nil {
					b.Fatal(err)
				}
				tk.Cost, tk.Settle = 7, true
				if s.Take(ctx, []sluice.Take{tk}, out); !out[0].Allowed {
					b.Fatalf("settle: %+v", out[0])
				}
			}
		})
	}
}

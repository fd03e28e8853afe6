package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// Gateways count each other by heartbeats in the store; a gateway that
// stops beating (it died) drops out of the count once its heartbeat
// expires, so the survivors' shares of a limit grow back. A heartbeat that
// never expired would leave each survivor a share of a limit split among
// the dead.
func TestADeadGatewaysHeartbeatExpires(t *testing.T) {
	s, err := redis.New(redis.Options{URL: redistest.Start(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Heartbeat(ctx, id, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Heartbeat(ctx, "a", ttl); err != nil || n != 3 {
		t.Fatalf("three gateways beating: %d (%v)", n, err)
	}
	// Only a goes on beating; b and c are dead.
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := s.Heartbeat(ctx, "a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("20 s after b and c stopped beating (heartbeats of %v), a still counts %d gateways", ttl, n)
		}
	}
	if err := s.Leave(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Heartbeat(ctx, "d", ttl); n != 1 {
		t.Fatalf("after a left, d alone counts %d", n)
	}
}

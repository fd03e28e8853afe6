package redis_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// Processes serving Envoys' quota streams see each other's claims on a
// bucket, their own apart; a process that stops claiming (it died) drops
// out once its claim expires, so the others' portions grow back; buckets
// are apart.
func TestQuotaClaimsAreSharedAndExpire(t *testing.T) {
	s, err := redis.New(redis.Options{URL: redistest.Start(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	bucket := "quota\x00name\x00shared"
	if others, err := s.Claims(ctx, bucket, "a", 2.5, ttl); err != nil || len(others) != 0 {
		t.Fatalf("the first claim: others %v (%v), want none", others, err)
	}
	if others, _ := s.Claims(ctx, bucket, "b", 7, time.Minute); !slices.Equal(others, []float64{2.5}) {
		t.Fatalf("b sees %v, want a's 2.5", others)
	}
	if others, _ := s.Claims(ctx, bucket+"x", "c", 1, ttl); len(others) != 0 {
		t.Fatalf("another bucket's claims: %v, want none", others)
	}
	if others, _ := s.Claims(ctx, bucket, "a", 3, ttl); !slices.Equal(others, []float64{7}) {
		t.Fatalf("a sees %v, want b's 7 and not its own", others)
	}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		others, err := s.Claims(ctx, bucket, "b", 7, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(others) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("20 s after a stopped claiming (claims of %v), b still sees %v", ttl, others)
		}
	}
}

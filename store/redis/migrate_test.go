package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// While a slot moves between masters, a call whose keys are partly on the
// old master and partly on the new one is refused with TRYAGAIN (Redis
// applies none of it). Two rules of one user, one already counted and
// migrated, the other new: the take waits for the slot to settle and is
// then counted once, exactly, not failed.
func TestATakeWaitsOutASlotHalfMigrated(t *testing.T) {
	cluster := redistest.StartCluster(t)
	s, err := redis.New(redis.Options{URL: cluster.URL(), Prefix: "mig:"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	take := func(ctx context.Context, rules ...string) ([]sluice.Decision, error) {
		var takes []sluice.Take
		for _, r := range rules {
			takes = append(takes, sluice.Take{Rule: r, Key: "alice", Limit: l, Cost: 1})
		}
		out := make([]sluice.Decision, len(takes))
		return out, s.Take(ctx, takes, out)
	}
	if _, err := take(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	ka := s.Key("a", "alice", l)
	var from, to *redistest.Server
	for _, n := range cluster.Nodes {
		if r, _ := n.Do("EXISTS", ka); r == ":1" {
			from = n
		} else if to == nil {
			to = n
		}
	}
	if from == nil {
		t.Fatalf("no master holds %q", ka)
	}
	slot, _ := from.Do("CLUSTER", "KEYSLOT", ka)
	slot = strings.TrimPrefix(slot, ":")
	fromID, _ := from.ClusterID()
	toID, _ := to.ClusterID()
	do := func(n *redistest.Server, args ...string) {
		t.Helper()
		if r, err := n.Do(args...); err != nil || strings.HasPrefix(r, "-") {
			t.Fatalf("%v on %s: %s %v", args, n.Addr, r, err)
		}
	}
	do(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
	do(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID)
	host, port, _ := strings.Cut(to.Addr, ":")
	do(from, "MIGRATE", host, port, "", "0", "5000", "KEYS", ka)
	// The old master answers ASK (it has neither key now); the new one,
	// asked, has one key of two: TRYAGAIN until the slot is its own.
	settled := make(chan struct{})
	go func() {
		time.Sleep(200 * time.Millisecond)
		for _, n := range cluster.Nodes {
			n.Do("CLUSTER", "SETSLOT", slot, "NODE", toID)
		}
		close(settled)
	}()
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := take(ctx2, "a", "b")
	if err != nil {
		t.Fatalf("a take during the migration failed: %v", err)
	}
	select {
	case <-settled:
	default:
		t.Fatal("the take was answered before the slot settled: it did not meet the migration")
	}
	if out[0].Remaining != 8 || out[1].Remaining != 9 || !out[0].Allowed || !out[1].Allowed {
		t.Errorf("after the migration: %+v, want rule a 8 left and rule b 9 left", out)
	}
}

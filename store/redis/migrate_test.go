package redis_test

import (
	"context"
	"strconv"
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
	slot, toID := halfMigrate(t, cluster, ka, nil)
	// The old master answers ASK (it has neither key now); the new one,
	// asked, has one key of two: TRYAGAIN until the slot is its own.
	// settling closes as the first SETSLOT NODE goes out: the take may
	// be answered as soon as the node it asks has settled, before the
	// others are told (a loaded run saw that), never before.
	settling, settled := make(chan struct{}), make(chan struct{})
	go func() {
		time.Sleep(200 * time.Millisecond)
		close(settling)
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
	case <-settling:
	default:
		t.Fatal("the take was answered before the slot began to settle: it did not meet the migration")
	}
	<-settled
	if out[0].Remaining != 8 || out[1].Remaining != 9 || !out[0].Allowed || !out[1].Allowed {
		t.Errorf("after the migration: %+v, want rule a 8 left and rule b 9 left", out)
	}
}

// A master added to the cluster gets the scripts before any slot reaches
// it: the first call asked there by ASK while a slot moves runs the script
// by its hash (EVALSHA), not refused NOSCRIPT and sent again with the
// script's text, two more round trips in the middle of a migration.
func TestAnAddedMasterHasTheScriptsBeforeItsFirstCall(t *testing.T) {
	cluster := redistest.StartCluster(t)
	s, err := redis.New(redis.Options{URL: cluster.URL(), Prefix: "add:"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	scripts := func(n *redistest.Server) int {
		_, v, _ := strings.Cut(n.Info("memory"), "number_of_cached_scripts:")
		v, _, _ = strings.Cut(v, "\r")
		k, _ := strconv.Atoi(strings.TrimSpace(v))
		return k
	}
	want := scripts(cluster.Nodes[0])
	if want == 0 {
		t.Fatal("Preload loaded no script")
	}
	added := cluster.AddMaster(t)
	for deadline := time.Now().Add(10 * time.Second); scripts(added) < want; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the added master has %d scripts of %d", scripts(added), want)
		}
	}
	// A key moved to the new master while its slot is still the old one's:
	// the old master answers ASK, and the call runs on the new one.
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	take := func() sluice.Decision {
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Take{{Rule: "a", Key: "bob", Limit: l, Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	take()
	halfMigrate(t, cluster, s.Key("a", "bob", l), added)
	if d := take(); !d.Allowed || d.Remaining != 8 {
		t.Fatalf("the take asked to the new master: %+v, want allowed with 8 left", d)
	}
	stats := added.Info("commandstats")
	if !strings.Contains(stats, "cmdstat_evalsha:calls=1,") {
		t.Errorf("the new master ran no EVALSHA:\n%s", stats)
	}
	if strings.Contains(stats, "cmdstat_eval:") || strings.Contains(stats, "failed_calls=1") {
		t.Errorf("the new master was sent the script's text or refused a call:\n%s", stats)
	}
}

// halfMigrate moves key from the master that holds it to another (to, or
// the first other master if nil) while its slot stays the old master's:
// IMPORTING on the new side, MIGRATING on the old, and the key MIGRATEd.
// Calls for the key then meet ASK. It returns the slot and the new master's
// id, for CLUSTER SETSLOT ... NODE.
func halfMigrate(t *testing.T, cluster *redistest.Cluster, key string, to *redistest.Server) (slot, toID string) {
	t.Helper()
	var from *redistest.Server
	for _, n := range cluster.Nodes {
		if r, _ := n.Do("EXISTS", key); r == ":1" {
			from = n
		}
	}
	if from == nil {
		t.Fatalf("no master holds %q", key)
	}
	for _, n := range cluster.Nodes {
		if to == nil && n != from {
			to = n
		}
	}
	slot, _ = from.Do("CLUSTER", "KEYSLOT", key)
	slot = strings.TrimPrefix(slot, ":")
	fromID, _ := from.ClusterID()
	toID, _ = to.ClusterID()
	host, port, _ := strings.Cut(to.Addr, ":")
	for _, step := range []struct {
		n    *redistest.Server
		args []string
	}{
		{to, []string{"CLUSTER", "SETSLOT", slot, "IMPORTING", fromID}},
		{from, []string{"CLUSTER", "SETSLOT", slot, "MIGRATING", toID}},
		{from, []string{"MIGRATE", host, port, "", "0", "5000", "KEYS", key}},
	} {
		if r, err := step.n.Do(step.args...); err != nil || strings.HasPrefix(r, "-") {
			t.Fatalf("%v on %s: %s %v", step.args, step.n.Addr, r, err)
		}
	}
	return slot, toID
}

package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// carryFixture is an engine on one rule, per-user 3 per 10 minutes under
// algorithm a, following a Memory store of overrides.
func carryFixture(t *testing.T, a sluice.Algorithm) (*fixture, *overrides.Memory, *overrides.Follower) {
	t.Helper()
	store := &overrides.Memory{}
	fol := &overrides.Follower{Store: store}
	f := newFixture(t, fmt.Sprintf(`
rules:
  - {id: per-user, key: [user], rate: 3, per: 10m, algorithm: %s}
`, a), Options{Overrides: fol.Current})
	return f, store, fol
}

func limitOverride(key string, rate int64) overrides.Override {
	return overrides.Override{Rule: "per-user", Key: key, Action: overrides.Limit, Rate: rate, Per: overrides.Duration(10 * time.Minute)}
}

// Every change of a key's limit by an operator keeps what the key spent in
// the window, for every algorithm: raised, lowered, changed again, removed,
// expired, by a prefix; keys the change does not name are untouched. The
// leaky queue admits one unit more than it queues (the one leaving now), so
// the figures are counted from what a fresh key admits under each limit.
func TestAKeyKeepsWhatItSpentAcrossOverrides(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			f, store, fol := carryFixture(t, a)
			extra := 0
			if a == sluice.LeakyQueue {
				extra = 1
			}
			// want checks that user, having used `used` since its window
			// began, is admitted what a fresh key under rate would be, less
			// what it used.
			want := func(what, user string, rate, used int) {
				t.Helper()
				if got, _ := admittedOf(t, f, user, 20); got != max(0, rate+extra-used) {
					t.Errorf("%s: %d of 20 admitted, want %d", what, got, max(0, rate+extra-used))
				}
			}
			// Raised: 3 used, raised to 6, 3 more.
			admittedOf(t, f, "raised", 3)
			put(t, store, fol, f.e, limitOverride("raised", 6))
			want("3 used, raised to 6", "raised", 6, 3)
			// Lowered: 3 used, lowered to 2, none.
			admittedOf(t, f, "lowered", 3)
			lowered := put(t, store, fol, f.e, limitOverride("lowered", 2))
			want("3 used, lowered to 2", "lowered", 2, 3)
			// Changed again: 2 used under an override of 4, changed to 10.
			put(t, store, fol, f.e, limitOverride("changed", 4))
			if got, _ := admittedOf(t, f, "changed", 2); got != 2 {
				t.Fatalf("under an override of 4: %d of 2", got)
			}
			put(t, store, fol, f.e, limitOverride("changed", 10))
			want("2 used under 4, changed to 10", "changed", 10, 2)
			// Removed: 6 used under 6, back to the rule's 3: none.
			removed := put(t, store, fol, f.e, limitOverride("removed", 6))
			admittedOf(t, f, "removed", 6)
			remove(t, store, fol, removed)
			want("6 used under 6, the override removed", "removed", 3, 6)
			// The lowered key handed back to 3 after its 3: none either.
			remove(t, store, fol, lowered)
			want("3 used, lowered, handed back to 3", "lowered", 3, 3)
			// A prefix: 1 used, the prefix raised to 5, 4 more.
			admittedOf(t, f, "team-a", 1)
			put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Prefix: "team-", Action: overrides.Limit, Rate: 5, Per: overrides.Duration(10 * time.Minute)})
			want("1 used, its prefix raised to 5", "team-a", 5, 1)
			// Untouched: a key no override names keeps the rule's own.
			want("a key no override names", "bystander", 3, 0)
		})
	}
}

// An override that expires hands its key back to the rule as a removal
// does: 5 used under 5, expired, back to 3: none more in the window.
func TestAnExpiredOverrideHandsTheKeyBackWithItsUsage(t *testing.T) {
	f, store, fol := carryFixture(t, sluice.GCRA)
	o := limitOverride("brief", 5)
	o.Expires = time.Now().Add(300 * time.Millisecond)
	put(t, store, fol, f.e, o)
	if got, _ := admittedOf(t, f, "brief", 5); got != 5 {
		t.Fatalf("under the override of 5: %d of 5", got)
	}
	// Wait for the event (the override out of force), not for a time.
	for deadline := time.Now().Add(time.Minute); fol.Current().Find("per-user", "brief", time.Now()) != nil; {
		if time.Now().After(deadline) {
			t.Fatal("the override never left force")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, res := admittedOf(t, f, "brief", 10); got != 0 || len(res.Overrides) != 0 {
		t.Fatalf("5 used, the override expired: %d of 10 admitted (overrides %v), want 0 under the rule's 3", got, res.Overrides)
	}
	// Dropped from the set once expired (a later change of the store), the
	// key still keeps its usage: the limit is remembered.
	put(t, store, fol, f.e, limitOverride("other", 4))
	if n := len(fol.Current().All()); n != 1 {
		t.Fatalf("the set holds %d overrides, want only the new one (the expired one dropped)", n)
	}
	if got, _ := admittedOf(t, f, "brief", 10); got != 0 {
		t.Fatalf("after the expired override left the set: %d of 10 admitted, want 0", got)
	}
}

// A rule file reloaded with another limit, and an Envoy descriptor's limit
// changed (as an xDS update does, through Reload), keep what each key
// spent: raised, 3 more; lowered, none.
func TestAReloadKeepsWhatEachKeySpent(t *testing.T) {
	for _, c := range []struct {
		name     string
		src      func(rate int) string
		take     func(f *fixture, key string) bool
		raisedTo int
	}{
		{"rule file", func(rate int) string {
			return fmt.Sprintf("rules:\n  - {id: per-user, key: [user], rate: %d, per: 10m}\n", rate)
		}, func(f *fixture, key string) bool {
			return f.check(t, userReq(key)).Allowed
		}, 6},
		{"envoy descriptor", func(rate int) string {
			return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", rate)
		}, func(f *fixture, key string) bool {
			var res Result
			if err := f.e.CheckDescriptors(context.Background(), "edge", []Descriptor{desc("user", key)}, &res); err != nil {
				t.Fatal(err)
			}
			return res.Allowed
		}, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.src(3), Options{})
			burst := func(key string) int {
				n := 0
				for n < 20 && c.take(f, key) {
					n++
				}
				return n
			}
			for _, k := range []string{"raised", "lowered"} {
				if n := burst(k); n != 3 {
					t.Fatalf("%s: %d admitted under 3", k, n)
				}
			}
			cfg, err := rules.Parse("test.yaml", []byte(c.src(c.raisedTo)))
			if err != nil {
				t.Fatal(err)
			}
			f.e.Reload(cfg)
			if n := burst("raised"); n != c.raisedTo-3 {
				t.Errorf("3 used, the limit reloaded as %d: %d admitted, want %d", c.raisedTo, n, c.raisedTo-3)
			}
			if n := burst("fresh"); n != c.raisedTo {
				t.Errorf("a new key after the reload: %d admitted, want %d", n, c.raisedTo)
			}
			cfg, err = rules.Parse("test.yaml", []byte(c.src(2)))
			if err != nil {
				t.Fatal(err)
			}
			f.e.Reload(cfg)
			if n := burst("lowered"); n != 0 {
				t.Errorf("3 used, the limit reloaded as 6 then 2: %d admitted, want 0", n)
			}
			if n := burst("raised"); n != 0 {
				t.Errorf("6 used, the limit reloaded as 2: %d admitted, want 0", n)
			}
		})
	}
}

// A process following the limits the others count under (FollowLimits)
// knows them once a round has read them, no longer while the store fails,
// and again once it answers: /readyz says not ready in between.
func TestTheLimitsOfTheOthersAreKnownOnceRead(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redis.New(redis.Options{URL: srv.URL(), Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := New(mustRules(t, "rules:\n  - {id: per-user, key: [user], rate: 3, per: 10m}\n"), Options{Store: s, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if !e.LimitsKnown() {
		t.Fatal("an engine that follows no history does not know it")
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: never", what)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.FollowLimits(ctx, s.LimitHistory(), 200*time.Millisecond)
	waitFor("the history read", e.LimitsKnown)
	srv.Stop()
	waitFor("the history unknown while the store is down", func() bool { return !e.LimitsKnown() })
	srv.Restart() // on the same address: the lazy store reconnects
	waitFor("the history read again once the store answers", e.LimitsKnown)
}

package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/store/memory"
)

// overrideFixture is an engine on two rules — per-user 3 an hour, and a
// global 100 an hour over every request — following a Memory store of
// overrides.
func overrideFixture(t *testing.T) (*fixture, *overrides.Memory, *overrides.Follower) {
	t.Helper()
	store := &overrides.Memory{}
	fol := &overrides.Follower{Store: store}
	f := newFixture(t, `
rules:
  - {id: per-user, key: [user], rate: 3, per: 1h}
  - {id: everyone, key: [ip], rate: 100, per: 1h}
  - {id: pricey, match: {path: /pricey}, key: [user], rate: 10, per: 1h, cost: 5}
  - {id: pair, match: {path: /pair}, key: [user, ip], rate: 10, per: 1h}
`, Options{Overrides: fol.Current})
	return f, store, fol
}

func put(t *testing.T, store *overrides.Memory, fol *overrides.Follower, e *Engine, o overrides.Override) *overrides.Override {
	t.Helper()
	if o.Expires.IsZero() && !o.UntilRemoved {
		o.Expires = time.Now().Add(time.Hour)
	}
	o.Reason, o.By = "a test", "t"
	if err := o.Check(time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckOverride(&o); err != nil {
		t.Fatal(err)
	}
	w, _, err := store.Put(context.Background(), o, -1, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := fol.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w
}

// remove takes override o out of the store and has fol read it.
func remove(t *testing.T, store *overrides.Memory, fol *overrides.Follower, o *overrides.Override) {
	t.Helper()
	if _, err := store.Delete(context.Background(), o.ID, o.Version, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := fol.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// admittedOf counts the admitted of n checks for user, and returns the last
// result.
func admittedOf(t *testing.T, f *fixture, user string, n int) (int, *Result) {
	t.Helper()
	ok := 0
	var res *Result
	for range n {
		if res = f.check(t, userReq(user)); res.Allowed {
			ok++
		}
	}
	return ok, res
}

func remaining(t *testing.T, f *fixture, rule, key string) int64 {
	t.Helper()
	d, _, err := f.e.Inspect(context.Background(), rule, key)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

func TestAnOverrideChangesItsRuleForItsKeysOnly(t *testing.T) {
	f, store, fol := overrideFixture(t)
	// A limit override counts the key under its own limit from what the
	// key spent under the rule; when it ends, the rule counts the key from
	// what it spent under the override.
	if n, _ := admittedOf(t, f, "raised", 2); n != 2 {
		t.Fatalf("before the override: %d of 2", n)
	}
	raised := put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "raised", Action: overrides.Limit, Rate: 5, Per: overrides.Duration(time.Hour)})
	n, res := admittedOf(t, f, "raised", 10)
	if n != 3 {
		t.Fatalf("2 used, raised to 5: %d of 10 admitted, want 3", n)
	}
	if len(res.Overrides) != 1 || res.Overrides[0].ID != raised.ID || res.Statuses[0].Override != raised.ID || res.Statuses[0].Limit.Rate != 5 {
		t.Fatalf("the answer does not name the override: %+v %+v", res.Overrides, res.Statuses[0])
	}
	if n, _ := admittedOf(t, f, "other", 10); n != 3 {
		t.Fatalf("another key under the rule: %d of 10, want the rule's 3", n)
	}
	remove(t, store, fol, raised)
	if n, _ := admittedOf(t, f, "raised", 10); n != 0 {
		t.Fatalf("5 used, the override removed (the rule's 3): %d of 10 admitted, want 0", n)
	}

	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "free", Action: overrides.Exempt})
	if n, _ := admittedOf(t, f, "free", 10); n != 10 {
		t.Fatalf("exempt: %d of 10 admitted", n)
	}
	if r := remaining(t, f, "per-user", "free"); r != 3 {
		t.Fatalf("exempt counted %d", 3-r)
	}

	before := remaining(t, f, "everyone", "203.0.113.7")
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "bad", Action: overrides.Block, Expires: time.Now().Add(10 * time.Minute)})
	n, res = admittedOf(t, f, "bad", 5)
	if n != 0 || res.Reason != sluice.ReasonLocked || res.Decision.RetryAfter < 9*time.Minute || res.Decision.RetryAfter > 10*time.Minute {
		t.Fatalf("blocked: %d admitted, reason %v, retry after %v (want 0, locked, about 10 m)", n, res.Reason, res.Decision.RetryAfter)
	}
	if after := remaining(t, f, "everyone", "203.0.113.7"); after != before {
		t.Fatalf("a blocked request was counted by another rule: %d -> %d", before, after)
	}
	if r := remaining(t, f, "per-user", "bad"); r != 3 {
		t.Fatalf("a blocked request was counted by its rule: %d left", r)
	}
}

// An operator cycling through limits leaves the stores holding the
// tables of the limits in force, never those of every limit once set:
// the store's and the fallback store's (which mirrors the store's counts
// for an outage), with or without a fallback that can drop them. The
// rule's own table, and its keys' counts, stay; so does a limit in force.
func TestLimitsNoOverrideUsesAreDropped(t *testing.T) {
	for _, fallback := range []string{"dropping", "keeping"} {
		t.Run(fallback, func(t *testing.T) { limitsDropped(t, fallback == "dropping") })
	}
}

// keepsLimits is a store that keeps its tables: it cannot drop a limit.
type keepsLimits struct{ sluice.Store }

func limitsDropped(t *testing.T, fallbackDrops bool) {
	store := &overrides.Memory{}
	fol := &overrides.Follower{Store: store}
	o := Options{Overrides: fol.Current}
	fb := memory.New()
	o.Fallback = fb
	if !fallbackDrops {
		o.Fallback = keepsLimits{fb}
	}
	f := newFixture(t, `
rules:
  - {id: per-user, key: [user], rate: 3, per: 1h}
  - {id: everyone, key: [ip], rate: 100, per: 1h}
`, o)
	tables := func(s *memory.Store, rule string) int {
		n := 0
		for _, st := range s.Stats() {
			if st.Rule == rule {
				n++
			}
		}
		return n
	}
	inForce := func(what string) {
		t.Helper()
		// The limits that left are kept while keys may carry from them,
		// the most recent maxPastLimits of them.
		if n := tables(f.mem, "per-user"); n > 3+maxPastLimits { // one more until the next rebuild
			t.Fatalf("%s: %d tables for per-user, want the rule's, the limit in force and at most %d that left", what, n, maxPastLimits)
		}
		if n := tables(fb, "per-user#fallback"); fallbackDrops && n > 2 {
			t.Fatalf("%s: the fallback store holds %d tables for per-user, want the rule's and the limit in force", what, n)
		}
	}
	put(t, store, fol, f.e, overrides.Override{Rule: "everyone", Key: "203.0.113.7", Action: overrides.Exempt, UntilRemoved: true})
	admittedOf(t, f, "steady", 2) // the rule's own table: 1 left for steady
	for i := range 300 {
		o := put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "cycled", Action: overrides.Limit, Rate: int64(10 + i), Per: overrides.Duration(time.Hour)})
		if n, _ := admittedOf(t, f, "cycled", 1); n != 1 {
			t.Fatalf("limit %d: refused", 10+i)
		}
		inForce(fmt.Sprintf("limit %d in force", 10+i))
		remove(t, store, fol, o)
	}
	// One more limit in force, and one the rule's own: neither is dropped.
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "kept", Action: overrides.Limit, Rate: 7, Per: overrides.Duration(time.Hour)})
	same := put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "same", Action: overrides.Limit, Rate: 3, Per: overrides.Duration(time.Hour)})
	admittedOf(t, f, "kept", 1)
	admittedOf(t, f, "same", 1)
	remove(t, store, fol, same)
	// The rules built again: "same"'s limit, the rule's own, is no longer
	// used by an override, and "kept"'s is.
	if n, _ := admittedOf(t, f, "kept", 10); n != 6 {
		t.Errorf("the limit in force lost its count: kept had 6 of 7 left, got %d of 10", n)
	}
	inForce("after 300 limits came and went")
	if n := tables(f.mem, "per-user"); n < 2 || n > 2+maxPastLimits {
		t.Errorf("%d tables for per-user, want 2 (the rule's, 7 an hour) and at most the %d most recent that left", n, maxPastLimits)
	}
	if n, _ := admittedOf(t, f, "steady", 3); n != 1 {
		t.Errorf("the rule's own count was lost: steady had 1 left, got %d of 3", n)
	}
}

func TestPrefixesAndExactKeys(t *testing.T) {
	f, store, fol := overrideFixture(t)
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Prefix: "load-", Action: overrides.Exempt})
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Prefix: "load-eu-", Action: overrides.Limit, Rate: 4, Per: overrides.Duration(time.Hour)})
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "load-eu-1", Action: overrides.Block})
	for _, c := range []struct {
		user string
		want int
	}{{"load-us-1", 10}, {"load-eu-2", 4}, {"load-eu-1", 0}, {"load", 3}, {"loader", 3}} {
		if n, _ := admittedOf(t, f, c.user, 10); n != c.want {
			t.Errorf("%s: %d of 10 admitted, want %d", c.user, n, c.want)
		}
	}
}

// An override ends at its expiry with no timer: the next request after it
// is counted under the rule again, the key's state as it stands.
func TestAnOverrideEndsAtItsExpiry(t *testing.T) {
	f, store, fol := overrideFixture(t)
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "u", Action: overrides.Exempt, Expires: time.Now().Add(300 * time.Millisecond)})
	if n, _ := admittedOf(t, f, "u", 5); n != 5 {
		t.Fatalf("exempt: %d of 5", n)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res := f.check(t, userReq("u")); len(res.Overrides) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the override still applies 10 s after its expiry")
		}
	}
	if n, _ := admittedOf(t, f, "u", 5); n != 2 {
		t.Fatalf("after the expiry: %d of 5 admitted, want the rule's 3 less the one taken", n)
	}
}

// What the rules cannot apply is refused with the field at fault.
func TestAnOverrideTheRulesCannotApplyIsRefused(t *testing.T) {
	f, _, _ := overrideFixture(t)
	for _, c := range []struct {
		o     overrides.Override
		field string
	}{
		{overrides.Override{Rule: "nope", Key: "u", Action: overrides.Exempt}, "rule"},
		{overrides.Override{Rule: "everyone", Prefix: "10.", Action: overrides.Exempt}, "prefix"},
		{overrides.Override{Rule: "per-user", Key: "u", Action: overrides.Limit, Rate: 1 << 62, Per: 1}, "rate"},
		{overrides.Override{Rule: "pricey", Key: "u", Action: overrides.Limit, Rate: 4, Per: overrides.Duration(time.Hour)}, "burst"},
		{overrides.Override{Rule: "pair", Prefix: "u", Action: overrides.Exempt}, "prefix"},
	} {
		err := f.e.CheckOverride(&c.o)
		fe, ok := err.(*overrides.FieldError)
		if !ok || fe.Field != c.field {
			t.Errorf("%+v: %v, want an error naming %s", c.o, err, c.field)
		}
		if c.o.Rule == "pair" && !strings.Contains(fe.Problem, "keyed by user and ip:") {
			t.Errorf("the sources are not named as they are: %v", fe)
		}
	}
	// A burst of exactly the rule's cost admits one request.
	if err := f.e.CheckOverride(&overrides.Override{Rule: "pricey", Key: "u", Action: overrides.Limit, Rate: 5, Per: overrides.Duration(time.Hour)}); err != nil {
		t.Errorf("a burst of the rule's cost: %v", err)
	}
}

// An operator's override of a rule wins over the file's override of the
// same rule for the same key while it lives.
func TestAnOperatorsOverrideWinsOverTheFiles(t *testing.T) {
	store := &overrides.Memory{}
	fol := &overrides.Follower{Store: store}
	f := newFixture(t, `
rules:
  - {id: per-user, key: [user], rate: 3, per: 1h, overrides: [{values: {user: [partner]}, rate: 10}]}
`, Options{Overrides: fol.Current})
	if n, _ := admittedOf(t, f, "partner", 20); n != 10 {
		t.Fatalf("the file's override: %d of 20, want 10", n)
	}
	o := put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "partner", Action: overrides.Block})
	n, res := admittedOf(t, f, "partner", 5)
	if n != 0 || len(res.Overrides) != 1 || res.Overrides[0].ID != o.ID {
		t.Fatalf("blocked over the file's override: %d admitted, overrides %+v", n, res.Overrides)
	}
	// The file's overrides list is not a rule of its own to override: an
	// exemption there would win over a block on the rule for the key.
	for _, r := range f.e.Config().Rules {
		if r.KeyLimitOf == "per-user" {
			err := f.e.CheckOverride(&overrides.Override{Rule: r.ID, Key: "partner", Action: overrides.Exempt})
			if fe, ok := err.(*overrides.FieldError); !ok || fe.Field != "rule" || !strings.Contains(fe.Problem, "name per-user") {
				t.Errorf("an override of %s, the file's overrides list: %v; want it refused, naming per-user", r.ID, err)
			}
			return
		}
	}
	t.Fatal("no rule is the file's overrides list of per-user")
}

// BenchmarkFiveRulesWithOverrides is BenchmarkFiveRules with 10,000
// operators' overrides in force: on other keys of the user rule (a map
// lookup that misses), and on the request's own key (a limit override).
func BenchmarkFiveRulesWithOverrides(b *testing.B) {
	for _, c := range []struct {
		name string
		own  bool
	}{{"none", false}, {"10k-on-other-keys", false}, {"10k-and-this-key", true}} {
		b.Run(c.name, func(b *testing.B) {
			clock := sluice.NewManualClock(epoch)
			cfg := mustRules(b, `
rules:
  - {id: ip, key: [ip], rate: 1000000, per: 1s}
  - {id: user, key: [user], rate: 1000000, per: 1s, burst: 1000}
  - {id: route, key: [user, route], match: {path: "/items"}, rate: 1000000, per: 1s}
  - {id: tenant, key: [tenant], rate: 1000000, per: 1s, algorithm: token-bucket}
  - {id: window, key: [user], rate: 1000000, per: 1s, algorithm: sliding-window}
`)
			var list []*overrides.Override
			if c.name != "none" {
				for i := range 10_000 {
					list = append(list, &overrides.Override{ID: fmt.Sprint(i), Rule: "user", Key: fmt.Sprint("other-", i), Action: overrides.Exempt, UntilRemoved: true})
				}
			}
			if c.own {
				list = append(list, &overrides.Override{ID: "own", Rule: "user", Key: "u42", Action: overrides.Limit, Rate: 2_000_000, Per: overrides.Duration(time.Second), UntilRemoved: true})
			}
			set := overrides.NewSet(1, list)
			e, err := New(cfg, Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet, Overrides: func() *overrides.Set { return set }})
			if err != nil {
				b.Fatal(err)
			}
			req := userReq("u42")
			req.Header["X-Tenant-Id"] = []string{"t1"}
			var res Result
			ctx := context.Background()
			for b.Loop() {
				clock.Advance(time.Microsecond)
				e.Check(ctx, req, CheckOptions{}, &res)
			}
			if len(res.Statuses) != 5 || !res.Allowed || (len(res.Overrides) == 1) != c.own {
				b.Fatalf("statuses %d, allowed %v, overrides %v", len(res.Statuses), res.Allowed, res.Overrides)
			}
		})
	}
}

// A rule's limit overrides have at most MaxOverrideLimits distinct limits;
// one more distinct is refused, one in use is not.
func TestARulesOverridesHaveFewDistinctLimits(t *testing.T) {
	f, store, fol := overrideFixture(t)
	for i := range MaxOverrideLimits {
		put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: fmt.Sprint("u", i), Action: overrides.Limit, Rate: int64(10 + i), Per: overrides.Duration(time.Hour)})
	}
	next := overrides.Override{Rule: "per-user", Key: "another", Action: overrides.Limit, Rate: 5, Per: overrides.Duration(time.Hour)}
	if err := f.e.CheckOverride(&next); err == nil || !strings.Contains(err.Error(), "distinct limits") {
		t.Fatalf("a distinct limit past the bound: %v", err)
	}
	next.Rate = 10 // in use
	if err := f.e.CheckOverride(&next); err != nil {
		t.Fatalf("a limit in use: %v", err)
	}
	again := overrides.Override{Rule: "per-user", Key: "u0", Action: overrides.Limit, Rate: 7, Per: overrides.Duration(time.Hour)}
	if err := f.e.CheckOverride(&again); err != nil {
		t.Fatalf("replacing an override's own limit: %v", err)
	}
}

// A limit override goes with its rule as the rule file has it now: a
// reload that changes the rule (its cost here) changes the rule the
// override counts under, the override's limit kept.
func TestALimitOverrideFollowsItsRuleAcrossAReload(t *testing.T) {
	f, store, fol := overrideFixture(t)
	put(t, store, fol, f.e, overrides.Override{Rule: "per-user", Key: "u", Action: overrides.Limit, Rate: 10, Per: overrides.Duration(time.Hour)})
	admittedOf(t, f, "u", 1)
	if r := remaining(t, f, "per-user", "u"); r != 3 {
		t.Fatalf("the rule's own count of u: %d, want 3 untouched", r)
	}
	f.e.Reload(mustRules(t, "rules:\n  - {id: per-user, key: [user], rate: 3, per: 1h, cost: 3}\n"))
	if n, _ := admittedOf(t, f, "u", 10); n != 3 {
		t.Fatalf("after the reload: %d of 10 admitted, want 3 (9 of the override's 10 left, 3 a request)", n)
	}
}

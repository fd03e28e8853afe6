package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"github.com/sluice-rl/sluice/storecall"
)

// hostileRules have two rules on one key (so a request's takes share a hash
// slot only if the tag is the key's), a penalty (more keys of the same
// tag), and an Envoy descriptor rule.
const hostileRules = `
rules:
  - {id: per-user, key: [user], rate: 2, per: 1h}
  - {id: per-user-daily, key: [user], rate: 100, per: 24h, penalty: {after: 2, block: 1m}}
  - {id: tenant, key: [tenant], rate: 2, per: 1h, envoy: {domain: edge, descriptors: [{key: tenant}]}}
`

func hostileEngine(t testing.TB, url string) *engine.Engine {
	cfg, err := rules.Parse("hostile.yaml", []byte(hostileRules))
	if err != nil {
		t.Fatal(err)
	}
	st, err := redis.New(redis.Options{URL: url, Prefix: "hostile:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	e, err := engine.New(cfg, engine.Options{Store: st, Fallback: memory.New(), Calls: storecall.Options{Timeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// checkKeyOnEngine sends user value v three times: the first two are
// admitted and the third refused, by the store (never the fallback), and
// nothing panics.
func checkKeyOnEngine(t *testing.T, e *engine.Engine, v string) {
	ctx := context.Background()
	for _, id := range []string{"per-user", "per-user-daily"} {
		if _, err := e.Reset(id, v); err != nil {
			t.Fatal(err)
		}
	}
	req := rules.Request{Method: "GET", Path: "/", Attributes: map[string]string{"user": v}}
	var res engine.Result
	for i, want := range []bool{true, true, false} {
		if err := e.Check(ctx, &req, engine.CheckOptions{}, &res); err != nil {
			t.Fatalf("user %q: check %d: %v", v, i+1, err)
		}
		if res.StoreError != nil {
			t.Fatalf("user %q: check %d: the store failed: %v", v, i+1, res.StoreError)
		}
		if res.Allowed != want {
			t.Fatalf("user %q: check %d: allowed=%v, want %v", v, i+1, res.Allowed, want)
		}
	}
}

var hostileSeeds = []string{
	"}x", "{T}", "{", "}", "{}", "}{", "a{b}c", "{a}{b}", "%7B", "%", "x}", "{{x}}",
	"\xff\xfe", "\x00", strings.Repeat("}", 100), strings.Repeat("{x}", 40),
}

// Key values with braces used to make the client panic on Redis Cluster
// ("multi key command with different key slots"): the take was grouped by the
// slot of the raw value, not of the key sent. Every value, whatever its
// bytes, must now be counted exactly.
func FuzzKeyValuesThroughEngineOnCluster(f *testing.F) {
	cluster := redistest.StartCluster(f)
	e := hostileEngine(f, cluster.URL())
	for _, s := range hostileSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if v == "" {
			return // a missing key skips the rule
		}
		checkKeyOnEngine(t, e, v)
	})
}

// The same values as Envoy descriptor values, which reach the store by
// another path.
func TestEnvoyDescriptorValuesWithBracesOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t)
	e := hostileEngine(t, cluster.URL())
	ctx := context.Background()
	for i, v := range hostileSeeds {
		v = v + string(rune('a'+i)) // a fresh count per value
		var res engine.Result
		for j, want := range []bool{true, true, false} {
			d := []engine.Descriptor{{Entries: []rules.EnvoyEntry{{Key: "tenant", Value: v}}, Hits: 1}}
			if err := e.CheckDescriptors(ctx, "edge", d, &res); err != nil {
				t.Fatalf("%q: %v", v, err)
			}
			if res.StoreError != nil || res.Allowed != want {
				t.Fatalf("descriptor %q: call %d: allowed=%v store error=%v, want allowed=%v", v, j+1, res.Allowed, res.StoreError, want)
			}
		}
	}
}

// A key value is stored as sent up to 64 bytes and by digest beyond, so a
// client cannot grow Redis with huge values, and two values never share a
// count.
func TestHugeKeyValuesCostRedisADigest(t *testing.T) {
	srv := redistest.Start(t)
	e := hostileEngine(t, srv.URL())
	ctx := context.Background()
	huge := strings.Repeat("9", 900_000)
	for i := range 20 {
		v := huge + string(rune('a'+i))
		req := rules.Request{Method: "GET", Path: "/", Attributes: map[string]string{"user": v}}
		var res engine.Result
		e.Check(ctx, &req, engine.CheckOptions{}, &res)
		if !res.Allowed || res.StoreError != nil {
			t.Fatalf("value %d: allowed=%v err=%v", i, res.Allowed, res.StoreError)
		}
	}
	keys, err := srv.Do("KEYS", "hostile:*")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 20*3*200 {
		t.Fatalf("the keys' names take %d bytes for 20 requests", len(keys))
	}
	if strings.Contains(keys, "99999999") {
		t.Fatal("a raw 900 KB value reached Redis")
	}
	// Distinct values that share their first 64 bytes have distinct counts.
	for i := range 2 {
		v := strings.Repeat("x", 64) + string(rune('a'+i))
		checkKeyOnEngine(t, e, v)
	}
}

// Every key a take writes carries a TTL of its time back to idle plus a
// second's grace, so nothing a client creates stays in Redis for good.
func TestEveryKeyHasATTLOfItsResetPlusGrace(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Options{URL: srv.URL(), Prefix: "ttl:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Rate: 10, Period: time.Minute, Algorithm: a}
		out := make([]sluice.Decision, 1)
		if err := st.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 3}}, out); err != nil {
			t.Fatal(err)
		}
		pttl, err := srv.Do("PTTL", st.Key("r", "k", l))
		if err != nil {
			t.Fatal(err)
		}
		ms, _ := strconv.ParseInt(strings.TrimPrefix(pttl, ":"), 10, 64)
		want := out[0].ResetAfter.Milliseconds() + 1000
		if ms <= 0 || ms > want+1 || ms < want-500 {
			t.Errorf("%v: PTTL %s ms, want about %d (reset %v + 1s grace)", a, pttl, want, out[0].ResetAfter)
		}
	}
}

// On a cluster, takes in different slots are separate script calls; when a
// later slot refuses, the earlier slots' units are given back, whichever
// slot comes first.
func TestClusterGivesBackEarlierSlotsWhenALaterOneRefuses(t *testing.T) {
	cluster := redistest.StartCluster(t)
	st, err := redis.New(redis.Options{URL: cluster.URL(), Prefix: "giveback:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	loose := sluice.Limit{Rate: 10, Period: time.Hour}
	tight := sluice.Limit{Rate: 1, Period: time.Hour}
	peek := func(key string) int64 {
		out := make([]sluice.Decision, 1)
		if err := st.Take(ctx, []sluice.Take{{Rule: "loose", Key: key, Limit: loose}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Remaining
	}
	// Exhaust the tight key, then take [loose a, loose c, tight b]: the
	// refusing slot is the last group.
	out := make([]sluice.Decision, 3)
	if err := st.Take(ctx, []sluice.Take{{Rule: "tight", Key: "b", Limit: tight, Cost: 1}}, out); err != nil || !out[0].Allowed {
		t.Fatalf("first tight take: %+v %v", out[0], err)
	}
	for range 3 {
		takes := []sluice.Take{
			{Rule: "loose", Key: "a", Limit: loose, Cost: 2},
			{Rule: "loose", Key: "c", Limit: loose, Cost: 3},
			{Rule: "tight", Key: "b", Limit: tight, Cost: 1},
		}
		if err := st.Take(ctx, takes, out); err != nil {
			t.Fatal(err)
		}
		if out[2].Allowed {
			t.Fatal("the exhausted key admitted")
		}
	}
	if out[0].Remaining != 10 || out[1].Remaining != 10 {
		t.Fatalf("a refused call reports %d and %d remaining, want the 10 and 10 left after the give-back", out[0].Remaining, out[1].Remaining)
	}
	if a, c := peek("a"), peek("c"); a != 10 || c != 10 {
		t.Fatalf("refused cross-slot takes kept units: a has %d, c has %d remaining, want 10 and 10", a, c)
	}
}

// On a cluster the store names, for each take, the master that serves its
// key: the engine keeps a breaker per master on it.
func TestPartitionNamesTheMasterOfTheKey(t *testing.T) {
	cluster := redistest.StartCluster(t)
	st, err := redis.New(redis.Options{URL: cluster.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := sluice.Limit{Rate: 1, Period: time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for st.Partition(&sluice.Take{Rule: "r", Key: "k0", Limit: l}) == "" {
		if time.Now().After(deadline) {
			t.Fatal("no slot map after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	seen := map[string]bool{}
	for i := range 60 {
		tk := sluice.Take{Rule: "r", Key: fmt.Sprint("k", i), Limit: l}
		owner := ""
		for _, n := range cluster.Nodes {
			if r, _ := n.Do("GET", st.Key(tk.Rule, tk.Key, tk.Limit)); !strings.HasPrefix(r, "-MOVED") {
				owner = n.Addr
			}
		}
		if got := st.Partition(&tk); got != owner {
			t.Fatalf("key %s: partition %q, owner %q", tk.Key, got, owner)
		}
		seen[owner] = true
	}
	if len(seen) != 3 {
		t.Fatalf("60 keys on %d masters", len(seen))
	}
	// One Redis has no partitions.
	one, err := redis.New(redis.Options{URL: redistest.Start(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if p := one.Partition(&sluice.Take{Rule: "r", Key: "k", Limit: l}); p != "" {
		t.Fatalf("single node partition %q", p)
	}
}

// A lazy store starts while Redis is down, answers ErrNotConnected, and
// connects when Redis comes.
func TestLazyStoreConnectsWhenRedisComes(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop()
	st, err := redis.New(redis.Options{URL: srv.URL(), Lazy: true, RetryEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("a lazy store refused to start: %v", err)
	}
	defer st.Close()
	l := sluice.Limit{Rate: 1, Period: time.Second}
	out := make([]sluice.Decision, 1)
	if err := st.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1}}, out); !errors.Is(err, redis.ErrNotConnected) {
		t.Fatalf("before Redis: %v, want ErrNotConnected", err)
	}
	if _, err := redis.New(redis.Options{URL: srv.URL()}); err == nil {
		t.Fatal("a store that is not lazy started without Redis")
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for st.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1}}, out) != nil {
		if time.Now().After(deadline) {
			t.Fatal("never connected after Redis came")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Limits whose arithmetic would pass 2^53 microseconds in Lua are refused,
// from exactly 2^53.
func TestLimitsTooLongForLuaAreRefused(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	period := time.Duration(1<<33) * time.Microsecond
	out := make([]sluice.Decision, 1)
	at := sluice.Limit{Rate: 1 << 20, Period: period, Algorithm: sluice.SlidingWindow} // limit x window = 2^53 µs
	if err := st.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: at, Cost: 1}}, out); err == nil {
		t.Fatal("limit x window = 2^53 µs accepted")
	}
	under := sluice.Limit{Rate: 1<<20 - 1, Period: period, Algorithm: sluice.SlidingWindow}
	if err := st.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: under, Cost: 1}}, out); err != nil {
		t.Fatalf("just under 2^53: %v", err)
	}
}

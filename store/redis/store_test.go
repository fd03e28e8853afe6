package redis_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"github.com/sluice-rl/sluice/store/storetest"
)

var prefixes atomic.Int64

// The conformance suite against a real redis-server, with the test's clock
// sent as the time: decisions identical to package algo at microsecond
// resolution.
func TestConformanceSingleNode(t *testing.T) { conformance(t, redistest.Start(t).URL()) }

// The same suite against a real three-master Redis Cluster.
func TestConformanceCluster(t *testing.T) { conformance(t, redistest.StartCluster(t).URL()) }

func conformance(t *testing.T, url string) {
	storetest.RunWith(t, storeOn(url), storetest.Options{Resolution: time.Microsecond})
}

// storeOn returns a factory of stores on url, each under a prefix of its own
// so that tests sharing a server never see each other's keys.
func storeOn(url string) func(*testing.T, sluice.Clock) sluice.Store {
	return func(t *testing.T, c sluice.Clock) sluice.Store {
		s, err := redis.New(redis.Options{URL: url, Clock: c, Prefix: fmt.Sprintf("t%d:", prefixes.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
}

func TestForgetAndAChangedLimitStartFresh(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redis.New(redis.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	take := func(l sluice.Limit, key string, cost int64) sluice.Decision {
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Take{{Rule: "r", Key: key, Limit: l, Cost: cost}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	gcra := sluice.Limit{Rate: 2, Period: time.Hour}
	take(gcra, "a*b", 2)
	if d := take(gcra, "a*b", 1); d.Allowed {
		t.Fatal("limit not applied")
	}
	// The same rule with another algorithm: a fresh count, no WRONGTYPE.
	log := sluice.Limit{Rate: 2, Period: time.Hour, Algorithm: sluice.SlidingLog}
	if d := take(log, "a*b", 1); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("changed limit: %+v", d)
	}
	// Forget drops the key under every limit; a key with glob characters
	// does not take others with it.
	take(gcra, "aXb", 2)
	if s.Forget("r", "nobody") || s.Forget("other-rule", "a*b") {
		t.Fatal("Forget found state that was never there")
	}
	if !s.Forget("r", "a*b") {
		t.Fatal("Forget found nothing")
	}
	if d := take(gcra, "a*b", 0); d.Remaining != 2 {
		t.Fatalf("after Forget: %+v", d)
	}
	if d := take(gcra, "aXb", 0); d.Remaining != 0 {
		t.Fatalf("Forget of a*b reset aXb: %+v", d)
	}
}

func TestParseURL(t *testing.T) {
	for _, ok := range []string{"redis://127.0.0.1:6379/0", "redis://u:p@127.0.0.1:6379/2", "rediss://127.0.0.1:6380", "redis-cluster://127.0.0.1:7000,127.0.0.1:7001", "redis-sentinel://mymaster@127.0.0.1:26379,127.0.0.1:26380"} {
		if _, err := redis.ParseURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "http://x", "redis-sentinel://127.0.0.1:26379", "redis-sentinel://m@"} {
		if _, err := redis.ParseURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	opt, _ := redis.ParseURL("redis-sentinel://mymaster@127.0.0.1:26379,127.0.0.1:26380")
	if opt.Sentinel.MasterSet != "mymaster" || len(opt.InitAddress) != 2 {
		t.Errorf("sentinel options %+v", opt.Sentinel)
	}
	// Credentials in a cluster or Sentinel URL are credentials, not part of
	// an address, and percent-decoded.
	opt, err := redis.ParseURL("redis-cluster://ops:s%40cret@127.0.0.1:7000,127.0.0.1:7001")
	if err != nil || opt.Username != "ops" || opt.Password != "s@cret" || !slices.Equal(opt.InitAddress, []string{"127.0.0.1:7000", "127.0.0.1:7001"}) {
		t.Errorf("cluster with credentials: %+v %v", opt, err)
	}
	opt, err = redis.ParseURL("redis-sentinel://ops:s3cret@mymaster@127.0.0.1:26379")
	if err != nil || opt.Password != "s3cret" || opt.Sentinel.Password != "s3cret" || opt.Sentinel.MasterSet != "mymaster" || !slices.Equal(opt.InitAddress, []string{"127.0.0.1:26379"}) {
		t.Errorf("sentinel with credentials: %+v %v", opt, err)
	}
}

// No error and no redacted URL repeats a password, however malformed the
// URL around it.
func TestStoreURLsNeverShowTheirPassword(t *testing.T) {
	for _, u := range []string{
		"redis://user:s3cret@127.0.0.1:1/0",
		"redis://user:s3c%zzret@127.0.0.1:1/0",
		"redis://u:s3cret#x@127.0.0.1:1",
		"redis://u:s3cret/x@127.0.0.1:1",
		"redis://u:s3cret?x@127.0.0.1:1",
		"Redis://user:s3cret@127.0.0.1:1/0",
		"redis-cluster://user:s3cret@127.0.0.1:1,127.0.0.1:2",
		"redis-cluster://user:s3c%zzret@127.0.0.1:1",
		"redis-sentinel://user:s3cret@m@127.0.0.1:1",
		"redis-sentinel://user:s3cret@",
		"redis://:s3cret@127.0.0.1:1",
		"redis://s3cret@127.0.0.1:1",
		"http://user:s3cret@127.0.0.1:1",
		"user:s3cret@127.0.0.1:1",
	} {
		if r := redis.Redact(u); strings.Contains(r, "s3c") {
			t.Errorf("Redact(%q) = %q", u, r)
		}
		if _, err := redis.ParseURL(u); err != nil && strings.Contains(err.Error(), "s3c") {
			t.Errorf("ParseURL(%q): %v", u, err)
		}
	}
	if r := redis.Redact("redis-sentinel://mymaster@127.0.0.1:1"); r != "redis-sentinel://mymaster@127.0.0.1:1" {
		t.Errorf("a Sentinel master name redacted: %q", r)
	}
}

// The store fuzzed over costs and time steps against package algo, on a real
// redis-server.
func FuzzCostAndTime(f *testing.F) {
	url := redistest.Start(f).URL()
	storetest.FuzzCostAndTime(f, storeOn(url), storetest.Options{Resolution: time.Microsecond})
}

// A take that names the limits its key may have had (sluice.Take.Was), on a
// real redis-server: the key exists under its limit, so the script only
// checks that it does; each limit named adds its key and four arguments to
// the call. Against the same take naming none.
//
//	go test ./store/redis -run '^$' -bench TakeNamingEarlierLimits -benchmem -count 8
func BenchmarkTakeNamingEarlierLimits(b *testing.B) {
	s, err := redis.New(redis.Options{URL: redistest.Start(b).URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := sluice.Limit{Rate: 1000000, Period: time.Second, Burst: 1 << 20}
	earlier := []sluice.Limit{{Rate: 500000, Period: time.Second, Burst: 1 << 19}, {Rate: 2000000, Period: time.Second, Burst: 1 << 20}}
	out := make([]sluice.Decision, 1)
	for _, n := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("was=%d", n), func(b *testing.B) {
			tk := []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1, Was: earlier[:n]}}
			for b.Loop() {
				if err := s.Take(ctx, tk, out); err != nil || !out[0].Allowed {
					b.Fatal(err, out[0])
				}
			}
		})
	}
}

// Two processes on one Redis see a limit change at different moments (an
// override reaches each within its follower's interval). The key's state
// under the old limit stays for a few seconds after it moved, so the
// process that has not seen the change counts from what the key spent,
// never afresh; and a change undone meanwhile carries back from the new
// limit, not from that copy.
func TestAProcessThatHasNotSeenAChangeCountsFromWhatTheKeySpent(t *testing.T) {
	server := redistest.Start(t)
	url := server.URL()
	a, err := redis.New(redis.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := redis.New(redis.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	three := sluice.Limit{Rate: 3, Period: 10 * time.Minute}
	six := sluice.Limit{Rate: 6, Period: 10 * time.Minute}
	burst := func(s *redis.Store, tk sluice.Take) int {
		out := make([]sluice.Decision, 1)
		n := 0
		for ; n < 20; n++ {
			if err := s.Take(ctx, []sluice.Take{tk}, out); err != nil {
				t.Fatal(err)
			}
			if !out[0].Allowed {
				break
			}
		}
		return n
	}
	if n := burst(a, sluice.Take{Rule: "r", Key: "k", Limit: three, Cost: 1}); n != 3 {
		t.Fatalf("a fresh key admitted %d under 3", n)
	}
	// A has seen the raise: the key moves, 3 more.
	if n := burst(a, sluice.Take{Rule: "r", Key: "k", Limit: six, Cost: 1, Was: []sluice.Limit{three}}); n != 3 {
		t.Fatalf("3 used, raised to 6: %d admitted, want 3", n)
	}
	// The copy under the old limit keeps its own life (the time its state
	// takes back to idle, minutes here), not a few seconds: a process cut
	// off from Redis for longer still finds it.
	reply, err := server.Do("PTTL", a.Key("r", "k", three))
	if ttl, perr := strconv.ParseInt(strings.TrimPrefix(reply, ":"), 10, 64); err != nil || perr != nil || ttl < 60_000 {
		t.Fatalf("the copy left under the old limit lives %q ms (%v), want its own time back to idle, minutes", reply, err)
	}
	// B has not: under the old limit, naming nothing, it finds the key
	// spent, not fresh.
	if n := burst(b, sluice.Take{Rule: "r", Key: "k", Limit: three, Cost: 1}); n != 0 {
		t.Fatalf("a process that has not seen the raise admitted %d afresh, want 0", n)
	}
	// The raise undone: 6 spent under 6 carry back, not the 3 of the copy.
	if n := burst(b, sluice.Take{Rule: "r", Key: "k", Limit: three, Cost: 1, Was: []sluice.Limit{six}}); n != 0 {
		t.Fatalf("6 used under 6, back to 3: %d admitted, want 0", n)
	}
	// And raised once more: what it spent under 6 is still spent.
	if n := burst(a, sluice.Take{Rule: "r", Key: "k", Limit: six, Cost: 1, Was: []sluice.Limit{three}}); n != 0 {
		t.Fatalf("6 used, back to 3, raised to 6 again: %d admitted, want 0", n)
	}
}

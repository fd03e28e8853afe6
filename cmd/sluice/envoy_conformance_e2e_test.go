package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// conformanceConfig exercises envoyproxy/ratelimit's configuration features,
// in its own format.
const conformanceConfig = `domain: conf
descriptors:
  - key: key1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: vip            # whitelisted: no limit, no nested descriptors
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: block
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: shady
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: route
    value: /api/*/action
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {name: login, unit: minute, requests_per_unit: 2}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// A sluice-format file with a rule id the Envoy file's limit name also
// uses: both load together, the Envoy ids being namespaced by domain.
const conformanceSluice = "rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 10, per: 15m}\n"

type rlsCase struct {
	t   *testing.T
	rls rlsv3.RateLimitServiceClient
}

func (c rlsCase) call(domain string, descs ...*ratelimitcommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs}, grpc.WaitForReady(true))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

func desc(kv ...string) *ratelimitcommonv3.RateLimitDescriptor {
	d := &ratelimitcommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Sequences modelled on envoyproxy/ratelimit's own integration tests and
// README, replayed over gRPC against `sluice serve` on the embedded store
// and on Redis: the answers the reference gives.
func TestEnvoyConformanceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	dir := t.TempDir()
	envoyFile, sluiceFile := filepath.Join(dir, "ratelimit.yaml"), filepath.Join(dir, "shop.yaml")
	os.WriteFile(envoyFile, []byte(conformanceConfig), 0o600)
	os.WriteFile(sluiceFile, []byte(conformanceSluice), 0o600)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			url := "memory"
			if store == "redis" {
				url = redistest.Start(t).URL()
			}
			addr := freeAddr(t)
			start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--grpc-listen", addr,
				"--config", envoyFile, "--config", sluiceFile, "--store", url)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := rlsCase{t, rlsv3.NewRateLimitServiceClient(conn)}
			ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			// The per-minute limits count in fixed windows, as the
			// reference's: the sequences below must not cross a minute.
			if left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute)); left < 15*time.Second {
				time.Sleep(left)
			}

			// A plain limit: remaining counts down; over the limit, 0 left.
			for i := range 21 {
				r := c.call("conf", desc("key1", "foo"))
				st := r.Statuses[0]
				if i < 20 && (r.OverallCode != ok || st.LimitRemaining != uint32(19-i) || st.CurrentLimit.GetRequestsPerUnit() != 20 ||
					st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE) {
					t.Fatalf("key1 call %d: %v", i+1, r)
				}
				if i == 20 && (r.OverallCode != over || st.Code != over || st.LimitRemaining != 0) {
					t.Fatalf("key1 over the limit: %v", r)
				}
			}
			// hits_addend 0 on a descriptor checks without consuming.
			d := desc("key1", "bar")
			d.HitsAddend = wrapperspb.UInt64(0)
			for range 30 {
				if r := c.call("conf", d); r.OverallCode != ok {
					t.Fatalf("a check with hits_addend 0 was refused: %v", r)
				}
			}
			if r := c.call("conf", desc("key1", "bar")); r.Statuses[0].LimitRemaining != 19 {
				t.Fatalf("hits_addend 0 consumed: %v", r)
			}
			// Whitelisted value: never limited, no current limit; the
			// general limit still applies to other values.
			for range 10 {
				if r := c.call("conf", desc("key2", "vip")); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
					t.Fatalf("whitelisted vip: %v", r)
				}
			}
			for i := range 6 {
				if r := c.call("conf", desc("key2", "other")); (r.OverallCode == ok) != (i < 5) {
					t.Fatalf("key2 call %d: %v", i+1, r)
				}
			}
			// requests_per_unit: 0 is always over.
			if r := c.call("conf", desc("block", "x")); r.OverallCode != over || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
				t.Fatalf("block: %v", r)
			}
			// Unlimited: OK, with the largest remaining.
			if r := c.call("conf", desc("free", "x")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != math.MaxUint32 {
				t.Fatalf("unlimited: %v", r)
			}
			// Shadow mode: over its limit, the descriptor's own code is OK too.
			for range 3 {
				if r := c.call("conf", desc("shady", "x")); r.OverallCode != ok || r.Statuses[0].Code != ok {
					t.Fatalf("shadow: %v", r)
				}
			}
			// share_threshold: every value under files/* shares 3 per hour.
			for range 3 {
				c.call("conf", desc("files", "files/a.pdf"))
			}
			if r := c.call("conf", desc("files", "files/b.csv")); r.OverallCode != over {
				t.Fatalf("share_threshold: files/b.csv not over after 3 of files/a.pdf: %v", r)
			}
			// A wildcard in the middle; without share_threshold each value
			// counts alone.
			for i := range 3 {
				if r := c.call("conf", desc("route", "/api/v1/action")); (r.OverallCode == ok) != (i < 2) {
					t.Fatalf("route call %d: %v", i+1, r)
				}
			}
			if r := c.call("conf", desc("route", "/api/v2/action")); r.OverallCode != ok {
				t.Fatalf("/api/v2/action shares /api/v1/action's count: %v", r)
			}
			if r := c.call("conf", desc("route", "/api/v1/other")); r.Statuses[0].CurrentLimit != nil {
				t.Fatalf("/api/v1/other matched /api/*/action: %v", r)
			}
			// quota_mode: over only when every quota descriptor is over.
			c.call("conf", desc("q1", "a"), desc("q2", "a"))
			if r := c.call("conf", desc("q1", "a"), desc("q2", "a")); r.OverallCode != over {
				t.Fatalf("both quotas over: %v", r)
			}
			if r := c.call("conf", desc("q1", "b"), desc("q2", "a")); r.OverallCode != ok || r.Statuses[1].Code != over {
				t.Fatalf("one quota of two over: %v", r)
			}
			// A descriptor limit in an unknown domain applies no limit.
			o := desc("k", "v")
			o.Limit = &ratelimitcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
			for range 3 {
				if r := c.call("nowhere", o); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
					t.Fatalf("override in an unknown domain: %v", r)
				}
			}
			// The Envoy limit named login answers under its name.
			if r := c.call("conf", desc("user", "u1")); r.Statuses[0].CurrentLimit.GetName() != "login" {
				t.Fatalf("named limit: %v", r)
			}
			// token-quota.sh: checks of 0 hits on the request path, usage
			// reported (hits_addend 1) once each stream is done; 2 per
			// minute. The third check finds the count at the limit and
			// passes; its report takes it over; the fourth is refused.
			hits := func(n uint64, kv ...string) *ratelimitcommonv3.RateLimitDescriptor {
				d := desc(kv...)
				d.HitsAddend = wrapperspb.UInt64(n)
				return d
			}
			for i := 1; i <= 4; i++ {
				r := c.call("conf", hits(0, "service", "service_2"))
				if (r.OverallCode == ok) != (i <= 3) {
					t.Fatalf("token quota, request %d: %v", i, r)
				}
				if i == 4 {
					if reset := r.Statuses[0].DurationUntilReset.AsDuration(); reset <= 0 || reset > time.Minute {
						t.Fatalf("token quota refused until %v, want within the minute", reset)
					}
					break
				}
				if r := c.call("conf", hits(1, "service", "service_2")); (r.OverallCode == ok) != (i <= 2) {
					t.Fatalf("token quota, usage report %d: %v", i, r)
				}
			}
			// multiservice-tokenquota.sh: service_1 (1 a minute) serves
			// until its check is over, then service_2 (2 a minute, already
			// over from above): every quota is over, the request is refused.
			r := c.call("conf", hits(0, "service", "service_1"), hits(0, "service", "service_2"))
			if r.OverallCode != ok || r.Statuses[0].Code != ok || r.Statuses[1].Code != over {
				t.Fatalf("multiservice, request 1: %v", r)
			}
			c.call("conf", hits(1, "service", "service_1"))
			c.call("conf", hits(1, "service", "service_1"))
			if r := c.call("conf", hits(0, "service", "service_1"), hits(0, "service", "service_2")); r.OverallCode != over {
				t.Fatalf("multiservice, both quotas spent: %v", r)
			}
		})
	}
}

// Over Envoy's gRPC API on Redis, with the defaults: 64 callers send 3,000
// calls for one descriptor over its limit of 5 per hour. Exactly 5 pass,
// and the refused calls are answered from the deny cache, not by a script
// call each.
func TestEnvoyOverTheLimitOnRedisIsAnsweredFromTheDenyCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	envoyFile := filepath.Join(t.TempDir(), "ratelimit.yaml")
	os.WriteFile(envoyFile, []byte("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"), 0o600)
	addr := freeAddr(t)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--grpc-listen", addr,
		"--config", envoyFile, "--store", redistest.Start(t).URL())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsCase{t, rlsv3.NewRateLimitServiceClient(conn)}
	c.call("d", desc("user", "warm-up")) // the connection and the scripts
	storeCalls := func() int64 {
		n, err := proctest.ReadMetric(base, "sluice_store_calls_total")
		if err != nil {
			t.Fatal(err)
		}
		return int64(n)
	}
	before := storeCalls()
	const callers, calls = 64, 3000
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := g; i < calls; i += callers {
				if c.call("d", desc("user", "u1")).OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := ok.Load(); got != 5 {
		t.Fatalf("%d calls passed, want exactly 5", got)
	}
	used := storeCalls() - before
	if used > calls/10 {
		t.Fatalf("%d store calls for %d decisions: the refused ones did not come from the deny cache", used, calls)
	}
	t.Logf("%d decisions, %d store calls", calls, used)
}

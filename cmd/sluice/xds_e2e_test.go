package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/internal/testkit/xdstest"
)

// The built binary configured as Envoy Gateway configures
// envoyproxy/ratelimit (CONFIG_TYPE=GRPC_XDS_SOTW and its variables, no
// rule file), against a management server built from go-control-plane:
// not ready until the first configuration; then exact under 64 callers;
// a bad update NACKed with the rules kept; the management server gone and
// back with a new state of the world.
func TestServeTakesItsRulesOverXDSEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	t.Setenv("CONFIG_TYPE", "GRPC_XDS_SOTW")
	t.Setenv("CONFIG_GRPC_XDS_SERVER_URL", mgmt.Addr)
	t.Setenv("CONFIG_GRPC_XDS_NODE_ID", "e2e")
	t.Setenv("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms") // so that the restart below takes a moment, not 10 s
	t.Setenv("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "500ms")
	grpcAddr := freeAddr(t)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--grpc-listen", grpcAddr)

	if code, body := proctest.Readyz(t, base); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before any configuration: %d %s", code, body)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)

	mgmt.Set(t, "e2e", "v1", xdstest.Limit("load", "load", "user", "", 3, rlsconf.RateLimitUnit_HOUR))
	waitVersion(t, base, "v1")
	// Ready once the version is recorded, a moment after the rules serve.
	proctest.WaitHealthy(t, []string{base})
	if ok := envoyOKs(t, rls, "u1", 200); ok != 3 {
		t.Fatalf("v1 (3 an hour), 200 calls from 64 callers: %d OK, want 3", ok)
	}

	// A bad update: refused, NACKed, v1 keeps serving.
	mgmt.Set(t, "e2e", "v2", xdstest.Limit("load", "load", "user", "", 3, rlsconf.RateLimitUnit_UNKNOWN))
	for end := time.Now().Add(20 * time.Second); proctest.Metric(t, base, `sluice_xds_updates_total{result="refused"}`) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the bad update was not counted refused within 20 s")
		}
	}
	if v := rulesVersion(t, base); v != "v1" {
		t.Fatalf("after a refused update the rules are %q, want v1", v)
	}
	if ok := envoyOKs(t, rls, "u1", 10); ok != 0 {
		t.Fatalf("after a refused update u1 got %d more OK", ok)
	}

	// The management server goes away: the rules stay.
	mgmt.Stop()
	for end := time.Now().Add(20 * time.Second); proctest.Metric(t, base, "sluice_xds_connected") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("sluice_xds_connected still 1 20 s after the server stopped")
		}
	}
	if ok := envoyOKs(t, rls, "u2", 50); ok != 3 {
		t.Fatalf("with the management server gone, a new user: %d OK, want 3 (the rules kept)", ok)
	}
	if code, _ := proctest.Readyz(t, base); code != http.StatusOK {
		t.Fatalf("/readyz with the management server gone: %d, want still ready (its rules serve)", code)
	}

	// Back on the same address, with a new state of the world.
	again := xdstest.Start(t, mgmt.Addr)
	again.Set(t, "e2e", "v3", xdstest.Limit("load", "load", "user", "", 5, rlsconf.RateLimitUnit_HOUR))
	waitVersion(t, base, "v3")
	if ok := envoyOKs(t, rls, "u3", 200); ok != 5 {
		t.Fatalf("v3 (5 an hour): %d OK, want 5", ok)
	}
	// A user that spent 3 under v1 keeps them: the update raised its
	// limit to 5, so 2 more, not a fresh 5.
	if ok := envoyOKs(t, rls, "u1", 50); ok != 2 {
		t.Fatalf("u1 spent 3 under v1 (3 an hour), v3 raised the limit to 5: %d more OK, want 2", ok)
	}
	if got := proctest.Metric(t, base, `sluice_rules_version_info{version="v3"}`); got != 1 {
		t.Fatalf("sluice_rules_version_info{version=\"v3\"} = %v", got)
	}
	if acks := proctest.Metric(t, base, `sluice_xds_updates_total{result="applied"}`); acks != 2 {
		t.Fatalf("applied updates: %v, want 2 (v1, v3)", acks)
	}
}

// rulesVersion is the Sluice-Rules-Version of /v1/rules.
func rulesVersion(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get("Sluice-Rules-Version")
}

func waitVersion(t *testing.T, base, want string) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); rulesVersion(t, base) != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the rules are %q 30 s on, want %q", rulesVersion(t, base), want)
		}
	}
}

// envoyOKs makes n calls for user of domain load from 64 callers and
// counts the OK answers; any error fails the test.
func envoyOKs(t *testing.T, rls rlsv3.RateLimitServiceClient, user string, n int) int {
	t.Helper()
	var ok, left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range 64 {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := rls.ShouldRateLimit(ctx, loadReq(user))
				cancel()
				if err != nil {
					firstErr.CompareAndSwap(nil, fmt.Sprint(err))
					continue
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatalf("a call failed: %v", e)
	}
	return int(ok.Load())
}

// Decisions go on while a large snapshot applies: the built binary, its
// rules from xDS, answers callers the whole time it takes in 50,000
// descriptors (1.1 MB), each call OK and the new rules in force after.
// The latencies before and during are logged for docs/service.md, not
// asserted: the machines are shared.
func TestDecisionsGoOnWhileALargeSnapshotApplies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	t.Setenv("CONFIG_TYPE", "GRPC_XDS_SOTW")
	t.Setenv("CONFIG_GRPC_XDS_SERVER_URL", mgmt.Addr)
	t.Setenv("CONFIG_GRPC_XDS_NODE_ID", "big")
	grpcAddr := freeAddr(t)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--grpc-listen", grpcAddr)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	mgmt.Set(t, "big", "v1", xdstest.Limit("load", "load", "user", "", 1_000_000, rlsconf.RateLimitUnit_HOUR))
	waitVersion(t, base, "v1")

	// calls runs 8 callers until done says stop or n calls are made, and
	// returns the latencies; any error fails the test.
	calls := func(n int64, done func() bool) []time.Duration {
		var mu sync.Mutex
		var took []time.Duration
		var left atomic.Int64
		left.Store(n)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for left.Add(-1) >= 0 && !done() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					start := time.Now()
					resp, err := rls.ShouldRateLimit(ctx, loadReq(fmt.Sprint("u", i)))
					d := time.Since(start)
					cancel()
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						t.Errorf("a call while the rules change: %v %v", resp, err)
						return
					}
					mu.Lock()
					took = append(took, d)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(took)
		return took
	}
	p99 := func(d []time.Duration) time.Duration { return d[len(d)*99/100] }
	quiet := calls(5_000, func() bool { return false })
	rssBefore := proctest.Metric(t, base, "process_resident_memory_bytes")

	big := xdstest.Limit("load", "load", "user", "", 1_000_000, rlsconf.RateLimitUnit_HOUR)
	for i := range 50_000 {
		big.Descriptors = append(big.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint("v", i),
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 10}})
	}
	began := time.Now()
	mgmt.Set(t, "big", "v2", big)
	var applied atomic.Bool
	var took time.Duration
	go func() {
		for end := time.Now().Add(60 * time.Second); rulesVersion(t, base) != "v2" && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		}
		took = time.Since(began)
		applied.Store(true)
	}()
	during := calls(1_000_000, applied.Load)
	for end := time.Now().Add(30 * time.Second); !applied.Load(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the large snapshot was not applied")
		}
	}
	if len(during) == 0 {
		t.Fatal("no decision was answered while the large snapshot applied")
	}
	if v := rulesVersion(t, base); v != "v2" {
		t.Fatalf("the rules are %q, want v2", v)
	}
	rss := proctest.Metric(t, base, "process_resident_memory_bytes")
	t.Logf("50,000 descriptors applied in %v; %d calls answered meanwhile, p99 %v (%v before); RSS %.0f MB, %.0f MB before",
		took.Round(time.Millisecond), len(during), p99(during), p99(quiet), rss/1e6, rssBefore/1e6)
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const hostileRules = `
rules:
  - {id: otp, match: {method: POST, path: /otp}, key: [user], rate: 1, per: 1h, failMode: closed}
  - {id: costly, match: {path: /export}, key: [user], rate: 100, per: 1h, cost: 3}
  - {id: per-user, match: {path: "/api/*"}, key: [user], rate: 2, per: 1h, penalty: {after: 1, block: 1h}}
  - {id: tenant, key: [tenant], rate: 2, per: 1h, envoy: {domain: edge, descriptors: [{key: tenant}]}}
`

// hostileServe starts the built binary with default flags (store as given)
// and a gRPC listener, and returns the HTTP base URL and a gRPC client.
func hostileServe(t *testing.T, extra ...string) (string, rlsv3.RateLimitServiceClient) {
	t.Helper()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(hostileRules), 0o600); err != nil {
		t.Fatal(err)
	}
	grpcAddr := freeAddr(t)
	base, _ := start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--watch", "0", "--grpc-listen", grpcAddr, "--config", rulesPath}, extra...)...)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return base, rlsv3.NewRateLimitServiceClient(conn)
}

type answer struct {
	Status  int `json:"-"` // the HTTP status (the body's "status" is the gateway's)
	Allowed bool
	Reason  string
	Rule    string
	Body    string
}

func postCheck(t *testing.T, base, path, body string) answer {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v (did the process die?)", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{Status: resp.StatusCode, Body: string(b)}
	json.Unmarshal(b, &a)
	return a
}

func checkBody(method, path, user string, cost string) string {
	c := ""
	if cost != "" {
		c = `,"cost":` + cost
	}
	return fmt.Sprintf(`{"request":{"method":%q,"path":%q},"attributes":{"user":%q}%s}`, method, path, user, c)
}

// The built binary, with the defaults a user gets, tried as an attacker
// would: path tricks, huge costs, bytes JSON cannot carry, a partly bad
// batch, and Envoy descriptors with braces and huge hits. Nothing crashes,
// nothing gets past a limit.
func TestServeWithstandsHostileInputEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	base, rls := hostileServe(t)
	hostileChecks(t, base, rls)
}

// The same on a real three-master Redis Cluster, where key values with
// braces used to panic the client and open the breaker for every user.
func TestServeOnRedisClusterWithstandsHostileInputEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	cluster := redistest.StartCluster(t)
	base, rls := hostileServe(t, "--store", cluster.URL())
	hostileChecks(t, base, rls)
	// Brace values through HTTP: each counted exactly (2 per hour).
	for _, v := range []string{"}x", "{T}", "{", "}", "a{b}c"} {
		var got []bool
		for range 3 {
			got = append(got, postCheck(t, base, "/v1/check", checkBody("GET", "/api/x", v, "")).Allowed)
		}
		if fmt.Sprint(got) != "[true true false]" {
			t.Fatalf("user %q: %v, want [true true false]", v, got)
		}
	}
	// Impatient clients: 60 gRPC calls with a 200µs deadline must not open
	// the breaker; the fail-closed otp rule keeps admitting a new user.
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Microsecond)
		rls.ShouldRateLimit(ctx, envoyReq(fmt.Sprint("impatient-", i), 1))
		cancel()
	}
	if a := postCheck(t, base, "/v1/check", checkBody("POST", "/otp", "fresh-user", "")); !a.Allowed {
		t.Fatalf("after impatient clients, a fail-closed rule refuses: %+v", a)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), "sluice_store_breaker_state 0") {
		t.Fatal("the breaker is not closed after impatient clients")
	}
}

func envoyReq(value string, hits uint32) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: value}},
	}}}
}

func hostileChecks(t *testing.T, base string, rls rlsv3.RateLimitServiceClient) {
	// Path tricks: one POST /otp per hour, whatever the spelling.
	if a := postCheck(t, base, "/v1/check", checkBody("POST", "/otp", "u1", "")); !a.Allowed {
		t.Fatalf("first otp: %+v", a)
	}
	for _, p := range []string{"//otp", "/otp/", "/./otp", "/x/../otp", "/%6Ftp", "/o%74p"} {
		if a := postCheck(t, base, "/v1/check", checkBody("POST", p, "u1", "")); a.Allowed || a.Rule != "otp" {
			t.Errorf("POST %s escaped the otp rule: %+v", p, a)
		}
	}
	// Huge costs: cost-exceeds-limit, never a wrap that resets the key.
	for _, c := range []string{"4611686018427387904", "9223372036854775807", "3074457345618258603"} {
		if a := postCheck(t, base, "/v1/check", checkBody("GET", "/export", "u2", c)); a.Allowed || a.Reason != "cost-exceeds-limit" {
			t.Errorf("cost %s: %+v", c, a)
		}
	}
	admitted := 0
	for range 40 {
		if postCheck(t, base, "/v1/check", checkBody("GET", "/export", "u2", "")).Allowed {
			admitted++
		}
	}
	if admitted != 33 {
		t.Errorf("costly rule admitted %d, want 33 (100 units at 3 each)", admitted)
	}
	for _, c := range []string{"-1", "1e99", "0"} {
		if a := postCheck(t, base, "/v1/check", checkBody("GET", "/export", "u2", c)); a.Status != 400 {
			t.Errorf("cost %s: %d, want 400", c, a.Status)
		}
	}
	// Bytes JSON cannot carry exactly are refused, never merged.
	for _, b := range []string{"{\"attributes\":{\"user\":\"\xff\"}}", `{"attributes":{"user":"\udc00"}}`} {
		if a := postCheck(t, base, "/v1/check", b); a.Status != 400 {
			t.Errorf("%q: %d, want 400", b, a.Status)
		}
	}
	// A batch answered 400 consumes nothing.
	good := checkBody("GET", "/api/x", "u3", "")
	if a := postCheck(t, base, "/v1/check:batch", "["+good+","+good+`,{"cost":-5}]`); a.Status != 400 {
		t.Fatalf("bad batch: %+v", a)
	}
	if a := postCheck(t, base, "/v1/check", good); !a.Allowed {
		t.Fatalf("the refused batch consumed u3's units: %+v", a)
	}
	// Envoy: brace values, huge hits, many at once from 64 callers: every
	// call is answered, the process lives.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Go(func() {
			for i := range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				v := []string{"{T}", "}x", "{", fmt.Sprint("{g", g, "}"), "\x00"}[i]
				hits := uint32(1)
				if i == 2 {
					hits = 1 << 31
				}
				_, err := rls.ShouldRateLimit(ctx, envoyReq(v, hits), grpc.WaitForReady(true))
				cancel()
				if err != nil && !strings.Contains(err.Error(), "InvalidArgument") {
					errs <- fmt.Errorf("%q: %v", v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	resp, err := rls.ShouldRateLimit(context.Background(), envoyReq("{T}", 1))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("{T} after 64 callers: %v %v, want OVER_LIMIT", resp, err)
	}
	if a := postCheck(t, base, "/v1/check", good); a.Status != 200 {
		t.Fatalf("the process no longer answers: %+v", a)
	}
}

// DNS rebinding against the built binary's admin endpoints, on the
// defaults (loopback, no token): a page under another name that resolves
// to 127.0.0.1, or another origin, cannot read the rules or reset a locked
// key; curl on the machine can. Both `serve` (admin on its listener) and
// `gateway` (admin on --admin-listen) are tried.
func TestAdminEndpointsRefuseRebindingEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	serveBase, _ := startServe(t, "--config", "../../examples/shop.yaml")
	admin := freeAddr(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	start(t, "gateway", "--config", "../../examples/shop.yaml", "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", admin, "--watch", "0")
	for _, base := range []string{serveBase, "http://" + admin} {
		for _, c := range []struct {
			method, path, host, origin string
			want                       int
		}{
			{"GET", "/v1/rules", "", "", 200},
			{"GET", "/v1/rules", "localhost", "", 200},
			{"GET", "/v1/rules", "attacker.example", "", 403},
			{"GET", "/v1/rules", "127.0.0.1.nip.io", "", 403},
			{"DELETE", "/v1/state?rule=otp-sms&key=8801799999999", "attacker.example", "", 403},
			{"DELETE", "/v1/state?rule=otp-sms&key=8801799999999", "", "http://attacker.example", 403},
			{"DELETE", "/v1/state?rule=otp-sms&key=8801799999999", "", "null", 403},
			{"DELETE", "/v1/state?rule=otp-sms&key=8801799999999", "", "", 200},
		} {
			req, _ := http.NewRequest(c.method, base+c.path, nil)
			if c.host != "" {
				req.Host = c.host
			}
			if c.origin != "" {
				req.Header.Set("Origin", c.origin)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("%s: %s %s Host %q Origin %q: %d, want %d", base, c.method, c.path, c.host, c.origin, resp.StatusCode, c.want)
			}
		}
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// startServe builds the binary and runs `sluice serve` on a free loopback
// port, returning its base URL and the process.
func startServe(t *testing.T, args ...string) (string, *exec.Cmd) {
	return start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--watch", "0"}, args...)...)
}

// start builds the binary once per test run and starts it with args; the
// first line it prints names its address.
func start(t testing.TB, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return proctest.Start(t, os.Stderr, args...)
}

// freeAddr returns a loopback address free a moment ago, for a listener
// the banner does not name (gRPC, admin).
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startTo is start with the process's stderr (its log) sent to stderr.
func startTo(t testing.TB, stderr io.Writer, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return proctest.Start(t, stderr, args...)
}

func TestServeEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	write := func(rate int) {
		src := "rules:\n  - {id: per-user, key: [user], rate: " + itoa(rate) + ", per: 1h}\n"
		if err := os.WriteFile(rulesPath, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	base, cmd := startServe(t, "--config", rulesPath)

	post := func(body string) (*http.Response, map[string]any) {
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return nil, nil
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Errorf("undecodable answer (%d): %v", resp.StatusCode, err)
		}
		return resp, v
	}

	// Bad input: 400 problem+json naming the field.
	if resp, v := post(`{"attributes":{"user":5}}`); resp.StatusCode != 400 || !strings.HasPrefix(fmt.Sprint(v["field"]), "attributes") ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("bad input: %d %v", resp.StatusCode, v)
	}

	// Traffic from 8 clients while the rules are reloaded by SIGHUP: every
	// request gets a well-formed 200 answer.
	var wg sync.WaitGroup
	var answered, failed atomic.Int64
	stop := make(chan struct{})
	for g := range 8 {
		wg.Go(func() {
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, v := post(`{"attributes":{"user":"u` + itoa(g) + `"}}`)
				if resp == nil || resp.StatusCode != 200 || v["allowed"] == nil {
					failed.Add(1)
					continue
				}
				answered.Add(1)
			}
		})
	}
	for i := range 5 {
		time.Sleep(20 * time.Millisecond)
		write(1000 + i)
		cmd.Process.Signal(syscall.SIGHUP)
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || answered.Load() == 0 {
		t.Fatalf("during reloads: %d answered, %d failed", answered.Load(), failed.Load())
	}
	// The last reload took: the rule now says 1004 per hour.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, v := post(`{"attributes":{"user":"fresh"}}`)
		if st, _ := v["statuses"].([]any); len(st) == 1 && st[0].(map[string]any)["limit"] == float64(1004) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reloaded rule never served: %v", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Metrics count the reloads; SIGTERM drains and exits cleanly.
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b := new(strings.Builder)
	bufio.NewReader(resp.Body).WriteTo(b)
	resp.Body.Close()
	if !strings.Contains(b.String(), `sluice_config_reloads_total{result="ok"}`) {
		t.Fatal("no reload metric")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sluice serve exited with %v after SIGTERM", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestGatewayEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	release := make(chan struct{})
	var upstreamHits atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		if r.URL.Path == "/slow" {
			<-release
		}
		w.Write([]byte("hello from upstream"))
	}))
	defer upstream.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: per-ip, key: [ip], rate: 3, per: 1h}\n"), 0o600)
	base, cmd := start(t, "gateway", "--config", rulesPath, "--upstream", upstream.URL, "--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")

	codes := []int{}
	for range 2 {
		resp, err := http.Get(base + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	// A slow request in flight when SIGTERM arrives is drained, not cut.
	slow := make(chan int, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			slow <- -1
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	for upstreamHits.Load() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	resp, err := http.Get(base + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	codes = append(codes, resp.StatusCode)
	if fmt.Sprint(codes) != "[200 200 429]" || upstreamHits.Load() != 3 {
		t.Fatalf("codes %v, upstream saw %d", codes, upstreamHits.Load())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)
	close(release)
	if code := <-slow; code != 200 {
		t.Fatalf("in-flight request during drain: %d", code)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
}

func TestMain(m *testing.M) { proctest.Main(m) }

// The built binary answers Envoy's ShouldRateLimit with go-control-plane's
// generated client, on an envoyproxy/ratelimit file loaded as it is.
func TestServeEnvoyGRPCEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	// Find a free port for gRPC: the banner names only the HTTP address.
	grpcAddr := freeAddr(t)
	_, cmd := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--grpc-listen", grpcAddr,
		"--config", "../../examples/envoy/ratelimit-config.yaml")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k"}, {Key: "path", Value: "/login"}},
	}}}
	var codes []string
	for range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.ShouldRateLimit(ctx, req, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.OverallCode.String())
	}
	if fmt.Sprint(codes) != "[OK OK OK OK OK OVER_LIMIT]" {
		t.Fatalf("codes %v", codes)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// Two `sluice serve` processes with --store redis share one count: a client
// alternating between them gets exactly the limit, not twice it.
func TestTwoServeProcessesShareARedisCount(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := redistest.Start(t)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: per-user, key: [user], rate: 10, per: 1h}\n"), 0o600)
	a, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rulesPath, "--store", srv.URL(), "--store-timeout", "2s")
	b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rulesPath, "--store", srv.URL(), "--store-timeout", "2s")
	allowed := 0
	for i := range 30 {
		base := a
		if i%2 == 1 {
			base = b
		}
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"u42"}}`))
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ Allowed bool }
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if v.Allowed {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("two gateways on one Redis admitted %d of 30, want exactly 10", allowed)
	}
}

// serve --legacy-headers answers the X-RateLimit fields beside the
// RateLimit ones, each describing the quota remaining counts: a bucket of
// 5 at once then 1 per second has a limit of 5, and 4 left after a check.
func TestServeLegacyHeadersDescribeTheBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: b, key: [user], rate: 1, per: 1s, burst: 5}\n"), 0o600)
	for _, legacy := range []bool{false, true} {
		args := []string{"--config", rulesPath}
		if legacy {
			args = append(args, "--legacy-headers")
		}
		base, _ := startServe(t, args...)
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"u"}}`))
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ Headers map[string]string }
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if v.Headers["RateLimit-Policy"] != `"b";q=5;w=5` || v.Headers["RateLimit"] != `"b";r=4` {
			t.Fatalf("legacy %v: headers %v", legacy, v.Headers)
		}
		if got := v.Headers["X-RateLimit-Limit"] + "/" + v.Headers["X-RateLimit-Remaining"]; (legacy && got != "5/4") || (!legacy && got != "/") {
			t.Fatalf("legacy %v: X-RateLimit-Limit/Remaining %q", legacy, got)
		}
	}
}

// The gateway, with its defaults, logs its 429s: one JSON line per rejection
// (with --log-format json), the key hashed, and no more lines a second than
// --decision-log-rate under a flood of rejected requests, the rest counted.
func TestGatewayLogsItsRejectionsBoundedly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: per-user, key: [user], rate: 1, per: 1h}\n"), 0o600)
	var log proctest.Output
	base, _ := startTo(t, &log, "gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--watch", "0", "--log-format", "json", "--decision-log-rate", "5")
	codes := map[int]int{}
	for range 200 {
		req, _ := http.NewRequest("GET", base+"/x", nil)
		req.Header.Set("X-User-ID", "secret-user-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[429] != 199 {
		t.Fatalf("codes %v, want 199 rejections", codes)
	}
	// Let a second pass so that the count of what was left out is logged
	// with the next line.
	time.Sleep(1100 * time.Millisecond)
	req, _ := http.NewRequest("GET", base+"/x", nil)
	req.Header.Set("X-User-ID", "secret-user-7")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(log.String(), `"suppressed"`) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// The count of the lines left out is logged once a second: read the
	// log until it has come (a busy machine may take a few seconds).
	var lines, suppressed int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lines, suppressed = countDecisionLines(t, log.String())
		if lines+suppressed >= 195 || time.Now().After(deadline) {
			break
		}
	}
	// 199 + 1 rejections in at most a few seconds: lines at 5 a second,
	// the rest counted.
	if lines < 5 || lines > 25 || lines+suppressed < 195 {
		t.Fatalf("%d lines and %d suppressed for 200 rejections", lines, suppressed)
	}
}

// countDecisionLines counts the decision lines of a JSON log and the lines
// it says it left out; each decision line must name per-user and a hashed
// key.
func countDecisionLines(t *testing.T, log string) (lines, suppressed int) {
	t.Helper()
	for _, l := range strings.Split(log, "\n") {
		var x struct {
			Msg        string `json:"msg"`
			Rule       string `json:"rule"`
			KeyHash    string `json:"key_hash"`
			Suppressed int    `json:"suppressed"`
		}
		if json.Unmarshal([]byte(l), &x) != nil {
			continue
		}
		switch x.Msg {
		case "sluice: decision":
			lines++
			if x.Rule != "per-user" || x.KeyHash == "" {
				t.Errorf("decision line %s", l)
			}
		case "sluice: decision log suppressed lines":
			suppressed += x.Suppressed
		}
	}
	if strings.Contains(log, "secret-user-7") {
		t.Error("the key appears in the log")
	}
	return lines, suppressed
}

// gateway --adaptive bounds what is in flight to a slow upstream: of 64
// requests at once, those beyond the limit are answered 503
// (temporary-reduced-capacity) at once instead of piling up, for both data
// planes, and /metrics shows the limit and what it shed.
func TestGatewayAdaptiveShedsBeyondItsLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { <-release }))
	defer up.Close()
	defer close(release)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: loose, key: [ip], rate: 100000, per: 1s}\n"), 0o600)
	for _, plane := range []string{"fasthttp", "net/http"} {
		admin := freeAddr(t)
		base, _ := start(t, "gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", admin,
			"--watch", "0", "--adaptive", "--data-plane", plane)
		codes := make(chan int, 64)
		client := &http.Client{Timeout: 10 * time.Second}
		for range 64 {
			go func() {
				resp, err := client.Get(base + "/x")
				if err != nil {
					codes <- 0
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 503 && !strings.Contains(string(body), "temporary-reduced-capacity") {
					codes <- -1
					return
				}
				codes <- resp.StatusCode
			}()
		}
		// The upstream holds every request it gets: those beyond the limit
		// come back 503 meanwhile.
		shed := 0
		for shed < 64-20 {
			select {
			case c := <-codes:
				if c != 503 {
					t.Fatalf("%s: a request answered %d while the upstream holds every one", plane, c)
				}
				shed++
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: %d of 64 shed, want at least 44 (the limit starts at 20)", plane, shed)
			}
		}
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(m), "sluice_concurrency_limit 20") || !strings.Contains(string(m), "sluice_concurrency_in_flight 20") {
			t.Fatalf("%s: metrics lack the limit or the in-flight count:\n%s", plane, proctest.Lines(string(m), "sluice_concurrency"))
		}
		for range 64 - shed { // let the held ones go, for the next data plane
			release <- struct{}{}
		}
		for range 64 - shed {
			<-codes
		}
	}
}

// With --log-format json, stdout is JSON too: the start-up lines are
// objects ({"banner": ...}) that still name the listener.
func TestJSONLogsMakeJSONStartUpLinesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cmd := exec.Command(proctest.Sluice(t), "serve", "--config", "../../examples/shop.yaml", "--listen", "127.0.0.1:0", "--log-format", "json")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	r := bufio.NewReader(out)
	for i := range 2 {
		line, err := r.ReadString('\n')
		var v struct{ Banner string }
		if err != nil || json.Unmarshal([]byte(line), &v) != nil || !strings.Contains(v.Banner, "http://127.0.0.1:") {
			t.Fatalf("stdout line %d: %q %v", i+1, line, err)
		}
	}
}

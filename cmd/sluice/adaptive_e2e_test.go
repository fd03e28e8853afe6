package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// `sluice gateway --adaptive`, both data planes, in front of an upstream
// that starts failing: the gateway sees the 5xx, its pressure factor falls,
// and the rule marked adaptive admits a fraction of its rate, answering
// 503 temporary-reduced-capacity with the reduced quota in RateLimit-Policy,
// while the rule that is not adaptive keeps its rate; once the upstream is
// healthy the factor comes back.
func TestGatewayAdaptiveRulesFollowTheUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	var failing atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(`rules:
  - {id: api, match: {path: "/api/*"}, key: [ip], rate: 600, per: 1m, adaptive: true}
  - {id: static, match: {path: "/static/*"}, key: [ip], rate: 100000, per: 1m}
`), 0o600)
	policy := regexp.MustCompile(`"api";q=(\d+)`)
	for _, plane := range []string{"fasthttp", "net/http"} {
		failing.Store(true)
		admin := freeAddr(t)
		base, _ := start(t, "gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0",
			"--admin-listen", admin, "--watch", "0", "--adaptive", "--data-plane", plane)
		// 64 clients for at most 3 s (and 4,000 requests) against the
		// failing upstream, each pausing 20 ms between requests: the
		// pressure is the upstream's answers over time (a 2 s average),
		// and unpaced clients spend the 4,000 in a tenth of a second, before
		// it can move.
		var mu sync.Mutex
		codes := map[int]int{}
		var reduced []string
		var badBody atomic.Int32
		var sent atomic.Int32
		deadline := time.Now().Add(3 * time.Second)
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for time.Now().Before(deadline) && sent.Add(1) <= 4000 {
					time.Sleep(20 * time.Millisecond)
					resp, err := http.Get(base + "/api/items")
					if err != nil {
						continue
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					mu.Lock()
					codes[resp.StatusCode]++
					if resp.StatusCode == 503 {
						if !strings.Contains(string(body), "temporary-reduced-capacity") {
							badBody.Add(1)
						}
						// The concurrency limit sheds with 503 too; the rate
						// limit's refusal says the limit it applies.
						if strings.Contains(string(body), "under load: the limit is") {
							reduced = append(reduced, resp.Header.Get("Ratelimit-Policy"))
						}
					}
					stop := len(reduced) >= 20
					mu.Unlock()
					if stop {
						return
					}
				}
			})
		}
		wg.Wait()
		if len(reduced) == 0 || badBody.Load() != 0 {
			t.Fatalf("%s: answers %v, %d from the rate limit, %d 503s without the problem type: want 503 temporary-reduced-capacity with RateLimit fields once the upstream fails", plane, codes, len(reduced), badBody.Load())
		}
		m := policy.FindStringSubmatch(reduced[len(reduced)-1])
		if m == nil {
			t.Fatalf("%s: RateLimit-Policy under pressure %q names no api quota", plane, reduced[len(reduced)-1])
		}
		if q, _ := strconv.Atoi(m[1]); q >= 600 || q < 60 {
			t.Fatalf("%s: RateLimit-Policy under pressure %q: want the quota reduced below 600, not below the floor 60", plane, reduced[len(reduced)-1])
		}
		// The rule that is not adaptive keeps its rate.
		resp, err := http.Get(base + "/static/logo.png")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 500 {
			t.Fatalf("%s: a request to a rule that is not adaptive: %d, want the upstream's 500", plane, resp.StatusCode)
		}
		if f := pressureFactor(t, admin); f >= 0.5 {
			t.Fatalf("%s: sluice_pressure_factor %v while the upstream fails", plane, f)
		}
		// Healthy again: the factor recovers within a few seconds.
		failing.Store(false)
		for i := 0; ; i++ {
			resp, err := http.Get(base + "/static/ok")
			if err == nil {
				resp.Body.Close()
			}
			if f := pressureFactor(t, admin); f > 0.9 {
				break
			} else if i == 100 {
				t.Fatalf("%s: factor %v 10 s after the upstream recovered", plane, f)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func pressureFactor(t *testing.T, admin string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^sluice_pressure_factor ([0-9.e+-]+)$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no sluice_pressure_factor in /metrics")
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	return f
}

// The built gateway with --adaptive, as an attacker would try it: one
// client (203.0.113.66, behind the trusted proxy the test plays) makes its
// own requests fail — on a route no rule counts, and on the adaptive route
// itself with a header the upstream answers 500 to — a few thousand times a
// second for 3 s, while four others use the adaptive route normally. The pressure
// follows the clients, one vote each: the factor stays at 1 and every one
// of the others' requests is served (before, the factor fell to 0.11-0.26
// and a well-behaved user got 10 of 40).
func TestGatewayPressureIsNotOneClientsToSet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/broken" || r.Header.Get("X-Evil") != "" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(`trustedProxies: [127.0.0.1/32]
rules:
  - {id: api, match: {path: "/api/*"}, key: [ip], rate: 6000, per: 1m, adaptive: true}
`), 0o600)
	admin := freeAddr(t)
	base, _ := start(t, "gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0",
		"--admin-listen", admin, "--watch", "0", "--adaptive")
	// get returns the status, and for a 503 whether the adaptive rule
	// refused it (its problem names the reduced limit) rather than the
	// concurrency limit shed it (load shedding, whoever sends the load).
	get := func(path, client string, evil bool) (int, bool) {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("X-Forwarded-For", client)
		if evil {
			req.Header.Set("X-Evil", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, strings.Contains(string(body), "under load: the limit is")
	}
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var attacks atomic.Int32
	for range 4 { // the attacker: 4 connections, a few thousand failures a second
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && i < 5000; i++ {
				get([]string{"/broken", "/api/x"}[i%2], "203.0.113.66", true)
				attacks.Add(1)
				time.Sleep(time.Millisecond)
			}
		})
	}
	var served, reduced, shed atomic.Int32
	for c := range 4 { // the others: 40 requests each over the same 3 s
		wg.Go(func() {
			for range 40 {
				code, byRule := get("/api/items", "198.51.100."+strconv.Itoa(c+1), false)
				switch {
				case code == 200:
					served.Add(1)
				case byRule:
					reduced.Add(1)
				default:
					shed.Add(1)
				}
				time.Sleep(70 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	f := pressureFactor(t, admin)
	if reduced.Load() != 0 || f < 0.9 {
		t.Fatalf("after %d failing requests from one client: the factor is %v and the adaptive rule refused the others %d times (served %d, shed %d)",
			attacks.Load(), f, reduced.Load(), served.Load(), shed.Load())
	}
	t.Logf("%d failing requests from one client; the others: %d of 160 served, %d shed by the concurrency limit, 0 refused by the adaptive rule; factor %v",
		attacks.Load(), served.Load(), shed.Load(), f)
}

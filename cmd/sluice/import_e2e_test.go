package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/nginxtest"
)

// nginx and sluice side by side: examples/proxies/nginx-limit-req.conf runs
// in a real nginx, and its translation by `sluice import nginx` in the built
// `sluice gateway` with default flags, both in front of one upstream. The
// same requests go to both, in the same order, and every answer's status
// is compared: bursts on three locations and the server's other paths, a
// key per user (and no key at all, which nginx does not count), a steady
// rate without burst, paths at the edges of the locations, and bursts
// paced instead of refused (all of it, and past its first two: delay=).
func TestImportedNginxLimitsCountAsNginxDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) }))
	defer up.Close()
	const conf = "../../examples/proxies/nginx-limit-req.conf"
	nginx := nginxtest.Start(t, conf, "127.0.0.1:1", strings.TrimPrefix(up.URL, "http://"))
	code, out, errs := runCLI(t, "import", "nginx", conf)
	if code != 0 {
		t.Fatalf("sluice import nginx: %d\n%s", code, errs)
	}
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(out), 0o600)
	sluice, _ := start(t, "gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")

	send := func(base, method, path, user string) int {
		req, _ := http.NewRequest(method, base+path, nil)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	type step struct {
		method, path, user string
		n                  int
		want               []int // the statuses of the n requests
	}
	repeat := func(code, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = code
		}
		return out
	}
	steps := []step{
		{"GET", "/api/items", "", 6, append(repeat(200, 4), 503, 503)}, // burst=3 nodelay: 4, then nginx's 503
		{"GET", "/shop/cart", "", 8, append(repeat(200, 6), 503, 503)}, // the server's zone, untouched by /api/
		{"GET", "/api/other", "", 1, []int{503}},                       // one zone for the location, whatever the path
		{"POST", "/login", "ann", 3, []int{200, 200, 429}},             // per user, limit_req_status 429
		{"POST", "/login", "bob", 3, []int{200, 200, 429}},
		{"POST", "/login", "", 4, repeat(200, 4)},    // no key: nginx counts nothing
		{"POST", "/login/x", "ann", 1, []int{503}},   // not = /login: the server's zone, spent
		{"GET", "/steady/a", "", 2, []int{200, 503}}, // 1r/s, no burst
		{"GET", "/steady/b", "", 1, []int{503}},      // still within the second
	}
	run := func(steps []step) {
		for _, s := range steps {
			for i := range s.n {
				n, sl := send(nginx, s.method, s.path, s.user), send(sluice, s.method, s.path, s.user)
				if n != s.want[i] || sl != s.want[i] {
					t.Fatalf("%s %s (user %q), request %d of %d: nginx %d, sluice %d, want %d", s.method, s.path, s.user, i+1, s.n, n, sl, s.want[i])
				}
			}
		}
	}
	run(steps)
	// Bursts that are paced, sent at once: /paced/ (burst=2) admits three,
	// delayed 0, 1 and 2 s, and refuses two; /upload/ (burst=3 delay=2)
	// admits four, the fourth delayed 1 s, and refuses two. Their answers
	// come back in any order: the statuses are counted.
	for _, b := range []struct {
		path        string
		n, admitted int
	}{{"/paced/x", 5, 3}, {"/upload/x", 6, 4}} {
		for _, base := range []string{nginx, sluice} {
			codes := make(chan int, b.n)
			for range b.n {
				go func() { codes <- send(base, "GET", b.path, "") }()
			}
			counts := map[int]int{}
			for range b.n {
				counts[<-codes]++
			}
			if counts[200] != b.admitted || counts[503] != b.n-b.admitted {
				t.Fatalf("%d at once to %s on %s: %v, want %d answered 200 and the rest 503", b.n, b.path, base, counts, b.admitted)
			}
		}
	}
	// A steady client, one request every 1.5 s, is never refused by
	// either: the rate is one a second.
	for range 3 {
		time.Sleep(1500 * time.Millisecond)
		run([]step{{"GET", "/steady/c", "", 1, []int{200}}})
	}
	t.Logf("nginx and sluice answered alike: %d steps and a steady client", len(steps))
}

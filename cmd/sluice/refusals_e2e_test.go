package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// The built gateway, default settings, under 64 keep-alive clients that
// alternate between two rules' paths with spoofed X-Forwarded-For and odd
// bytes in their user keys: exactly each limit passes, and every refusal —
// the gateway keeps its last rendered refusal per worker and writes it again
// while refusals repeat — names its own rule in its fields and its body.
func TestGatewayRefusalsUnderAttackEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	var upstreamHits atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		w.Write([]byte("ok"))
	}))
	defer upstream.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n"+
		"  - {id: a, match: {path: /a}, key: [ip], rate: 5, per: 1h}\n"+
		"  - {id: b, match: {path: /b}, key: [user], rate: 3, per: 1h}\n"), 0o600)
	base, _ := start(t, "gateway", "--config", rulesPath, "--upstream", upstream.URL, "--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")

	users := []string{"ü-ñ", "{x}", "%7B}", "a b"}
	policy := map[string]string{"/a": `"a";q=5;w=3600`, "/b": `"b";q=3;w=3600`}
	var passed [2]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for c := range 64 {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for i := range 30 {
				path := []string{"/a", "/b"}[(c+i)%2]
				req, _ := http.NewRequest("GET", base+path, nil)
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", (c*30+i)%250))
				req.Header.Set("X-User-ID", users[(c+i/2)%len(users)])
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200:
					passed[path[1]-'a'].Add(1)
				case resp.StatusCode != 429 || resp.Header.Get("RateLimit-Policy") != policy[path] ||
					resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"violated-policies":["`+path[1:]+`"]`):
					errs <- fmt.Errorf("%s: %d %v %s", path, resp.StatusCode, resp.Header, body)
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
	// /a counts one address (the forwarding header is not trusted), /b each of the four users.
	if a, b := passed[0].Load(), passed[1].Load(); a != 5 || b != 3*int64(len(users)) || upstreamHits.Load() != a+b {
		t.Fatalf("passed /a %d (want 5), /b %d (want %d), upstream saw %d", a, b, 3*len(users), upstreamHits.Load())
	}
}

package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

func TestGatewayLimitsProxiesAndRebuildsForwardedFor(t *testing.T) {
	var seenXFF []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenXFF = append(seenXFF, r.Header.Get("X-Forwarded-For"))
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	defer upstream.Close()
	cfg, _ := rules.Parse("g.yaml", []byte("trustedProxies: [192.0.2.0/24]\nrules:\n  - {id: per-ip, key: [ip], rate: 2, per: 1m}\n"))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	u, _ := url.Parse(upstream.URL)
	gw := Handler(u, e, Options{})

	do := func(peer, xff string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/items", nil)
		r.RemoteAddr = peer
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		w := httptest.NewRecorder()
		gw.ServeHTTP(w, r)
		return w
	}
	// An untrusted client's forged chain is dropped.
	if w := do("203.0.113.7:1000", "6.6.6.6"); w.Code != 200 || w.Body.String() != "upstream /items" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	// A trusted proxy's chain is kept and the client appended.
	do("192.0.2.5:1000", "198.51.100.1")
	if seenXFF[0] != "203.0.113.7" || seenXFF[1] != "198.51.100.1, 192.0.2.5" {
		t.Fatalf("X-Forwarded-For seen upstream: %q", seenXFF)
	}
	do("203.0.113.7:1000", "")
	if w := do("203.0.113.7:1000", ""); w.Code != 429 || len(seenXFF) != 3 {
		t.Fatalf("third request from one client: %d (upstream saw %d)", w.Code, len(seenXFF))
	}
	// An upstream that is gone: 502 problem.
	upstream.Close()
	w := do("198.51.100.99:1", "")
	if w.Code != 502 || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(w.Body.String(), "Bad Gateway") {
		t.Fatalf("dead upstream: %d %s", w.Code, w.Body)
	}
}

// The net/http plane copies each response body to its client through a
// pooled buffer: bodies stay whole with many copies at once, and a
// forwarded request no longer allocates the 32 KiB buffer
// httputil.ReverseProxy makes for each request without a pool.
func TestNetHTTPPlaneCopiesBodiesThroughPooledBuffers(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Write(bytes.Repeat([]byte{byte(n)}, n<<10+n)) // n KiB and n bytes of n
	}))
	defer upstream.Close()
	cfg, _ := rules.Parse("g.yaml", []byte("rules:\n  - {id: loose, key: [ip], rate: 1000000000, per: 1s}\n"))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	u, _ := url.Parse(upstream.URL)
	front := httptest.NewServer(Handler(u, e, Options{}))
	defer front.Close()
	client := front.Client()
	get := func(n int) error {
		resp, err := client.Get(fmt.Sprintf("%s/b?n=%d", front.URL, n))
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if len(body) != n<<10+n || bytes.Count(body, []byte{byte(n)}) != len(body) {
			return fmt.Errorf("body %d: %d bytes, not %d bytes of %d", n, len(body), n<<10+n, n)
		}
		return nil
	}

	errs := make(chan error, 16*8)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 8 {
				errs <- get(40 + g*8 + i) // 40 KiB and more: past a buffer, each body its own bytes
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	const requests = 300
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range requests {
		if err := get(0); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	// Everything the test's process allocates counts here, the client and
	// the upstream too (about 14 KiB a request); a buffer made per request
	// would add its 32 KiB on top.
	if perRequest := (after.TotalAlloc - before.TotalAlloc) / requests; perRequest >= copyBufferSize {
		t.Fatalf("%d bytes allocated a forwarded request, want under %d: is the copy buffer made afresh?", perRequest, copyBufferSize)
	}
}

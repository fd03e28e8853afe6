package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime/metrics"
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
		w.Write(bodyOf(n))
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
		if !bytes.Equal(body, bodyOf(n)) {
			return fmt.Errorf("body %d changed on the way: %d bytes arrived of %d sent", n, len(body), len(bodyOf(n)))
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

	// A buffer made for each request is an allocation of 32 KiB each
	// request; pooled, there are next to none (the race detector drops a
	// quarter of what goes back into a pool, on purpose).
	const requests = 300
	before := largeAllocs()
	for range requests {
		if err := get(0); err != nil {
			t.Fatal(err)
		}
	}
	if n := largeAllocs() - before; n >= requests/2 {
		t.Fatalf("%d allocations of 28 KiB or more in %d forwarded requests: is the copy buffer made afresh?", n, requests)
	}
}

// bodyOf is body n: n KiB and n bytes, byte i of them n+i (mod 256), so
// that bytes of another body, or of another place in this one, show.
func bodyOf(n int) []byte {
	b := make([]byte, n<<10+n)
	for i := range b {
		b[i] = byte(n + i)
	}
	return b
}

// largeAllocs counts the process's heap allocations of 28 KiB and more so
// far, whoever made them.
func largeAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs-by-size:bytes"}}
	metrics.Read(s)
	h := s[0].Value.Float64Histogram()
	var n uint64
	for i, c := range h.Counts {
		if h.Buckets[i] >= 28<<10 { // Counts[i] is of sizes from Buckets[i]
			n += c
		}
	}
	return n
}

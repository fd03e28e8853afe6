package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
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

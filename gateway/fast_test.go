package gateway

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

func startFast(t *testing.T, upstream string, src string, o Options) string {
	t.Helper()
	cfg, err := rules.Parse("g.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(upstream)
	o.Logger = quietLog
	g := NewFast(u, e, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	return "http://" + ln.Addr().String()
}

const fastRules = "trustedProxies: [127.0.0.2/32]\nrules:\n  - {id: otp, match: {path: /otp}, key: [ip], rate: 2, per: 1h}\n  - {id: all, key: [ip], rate: 1000000, per: 1s}\n"

// Over the limit, the client gets the 429 problem and the upstream never
// sees the request.
func TestFastGatewayRejectsWithoutTheUpstream(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer up.Close()
	base := startFast(t, up.URL, fastRules, Options{})
	var codes []int
	for _, p := range []string{"/otp", "/otp", "/otp", "//otp/", "/%6Ftp"} {
		resp, err := http.Post(base+p, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 429 && (resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "quota-exceeded") ||
			resp.Header.Get("Content-Type") != "application/problem+json") {
			t.Fatalf("429 without its fields: %v %s", resp.Header, body)
		}
	}
	if calls.Load() != 2 || codes[2] != 429 || codes[3] != 429 || codes[4] != 429 {
		t.Fatalf("codes %v, upstream calls %d: want 2 through, the rest 429", codes, calls.Load())
	}
}

// Refusals of different rules, one after another on one connection (so
// through the same worker state, which keeps its last refusal to write it
// again), each name their own rule: a kept refusal is never another's.
func TestFastGatewayRefusalsNameTheirOwnRule(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	base := startFast(t, up.URL, "rules:\n  - {id: a, match: {path: /a}, key: [ip], rate: 1, per: 1h}\n  - {id: b, match: {path: /b}, key: [ip], rate: 2, per: 1m}\n", Options{})
	want := map[string]string{"/a": `"a";q=1;w=3600`, "/b": `"b";q=2;w=60`}
	for i, p := range []string{"/a", "/b", "/b", "/a", "/a", "/b", "/a", "/b", "/b", "/a"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if i < 3 { // the first of /a, the first two of /b pass
			continue
		}
		if resp.StatusCode != 429 || resp.Header.Get("RateLimit-Policy") != want[p] ||
			!strings.Contains(string(body), `"violated-policies":["`+p[1:]+`"]`) {
			t.Fatalf("request %d to %s: %d %v %s", i, p, resp.StatusCode, resp.Header, body)
		}
	}
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// The fasthttp plane finds the fields the rules read without putting every
// name in canonical form; it must find exactly those
// http.CanonicalHeaderKey would, whatever the bytes and case sent.
func TestCanonicalInFindsWhatCanonicalHeaderKeyWould(t *testing.T) {
	names := []string{"Cookie", "Content-Type", "Forwarded", "X-Api-Key", "X-Forwarded-For", "X_tenant", "K"}
	alphabet := []byte("aAkKxX-_ \x00\xe2\x84\xaaeEfFoOrRwWdDiIpPyYtTnN")
	r := rand.New(rand.NewPCG(3, 5))
	cases := [][]byte{[]byte("x-forwarded-for"), []byte("X-FORWARDED-FOR"), []byte("x_tenant"), []byte("X_Tenant"),
		[]byte("k"), []byte("\xe2\x84\xaa"), []byte("x-api-key "), []byte("X-Api-Key")}
	for range 200000 {
		b := make([]byte, 1+r.IntN(16))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(2) == 0 { // a name near one of the list
			n := names[r.IntN(len(names))]
			b = []byte(n)
			for i := range b {
				if r.IntN(3) == 0 {
					b[i] ^= 0x20
				}
			}
		}
		cases = append(cases, b)
	}
	for _, k := range cases {
		ck := http.CanonicalHeaderKey(string(k))
		want := slices.Contains(names, ck)
		got, ok := canonicalIn(k, names)
		if ok != want || (ok && got != ck) {
			t.Fatalf("name %q: canonicalIn %q, %v; CanonicalHeaderKey %q, listed %v", k, got, ok, ck, want)
		}
	}
}

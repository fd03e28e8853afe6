package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type fixture struct {
	clock *sluice.ManualClock
	eng   *engine.Engine
	h     http.Handler
	calls int
}

func newFixture(t testing.TB, src string, o Options) *fixture {
	t.Helper()
	cfg, err := rules.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{clock: sluice.NewManualClock(epoch)}
	f.eng, err = engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(f.clock)), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.h = Middleware(f.eng, o)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls++
		if code := r.Header.Get("X-Test-Status"); code != "" {
			n, _ := strconv.Atoi(code)
			w.WriteHeader(n)
		}
		io.WriteString(w, "ok")
	}))
	return f
}

func (f *fixture) do(method, path string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = "203.0.113.7:51000"
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

const perUser = `
rules:
  - {id: per-user, key: [user], rate: 100, per: 1m, burst: 20}
`

// sfList parses a header as a structured-field list, failing the test if it
// does not parse: a malformed field is ignored whole by clients.
func sfList(t *testing.T, h http.Header, name string) httpsfv.List {
	t.Helper()
	vals := h.Values(name)
	if len(vals) == 0 {
		t.Fatalf("no %s header", name)
	}
	l, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		t.Fatalf("%s: %q does not parse as a structured-field list: %v", name, vals, err)
	}
	return l
}

func param(t *testing.T, it httpsfv.Item, key string) int64 {
	t.Helper()
	v, ok := it.Params.Get(key)
	if !ok {
		t.Fatalf("item %v has no %q parameter", it.Value, key)
	}
	n, ok := v.(int64)
	if !ok {
		t.Fatalf("parameter %q of %v is %T, not an integer", key, it.Value, v)
	}
	return n
}

func TestRejectionIsAnsweredByTheBook(t *testing.T) {
	f := newFixture(t, perUser, Options{})
	for range 20 {
		if w := f.do("GET", "/items", "X-User-ID", "u42"); w.Code != 200 {
			t.Fatalf("within the burst: %d", w.Code)
		}
	}
	f.clock.Advance(0)
	w := f.do("GET", "/items", "X-User-ID", "u42")
	if w.Code != http.StatusTooManyRequests || f.calls != 20 {
		t.Fatalf("21st: %d (handler called %d times)", w.Code, f.calls)
	}
	h := w.Header()
	retry, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || retry < 1 {
		t.Fatalf("Retry-After %q", h.Get("Retry-After"))
	}
	pol := sfList(t, h, "RateLimit-Policy")
	it := pol[0].(httpsfv.Item)
	// 20 at once, then 100 a minute: 20 requests, given back in 12 s.
	if it.Value != "per-user" || param(t, it, "q") != 20 || param(t, it, "w") != 12 {
		t.Fatalf("RateLimit-Policy %q", h.Get("RateLimit-Policy"))
	}
	rl := sfList(t, h, "RateLimit")[0].(httpsfv.Item)
	if rl.Value != "per-user" || param(t, rl, "r") != 0 {
		t.Fatalf("RateLimit %q", h.Get("RateLimit"))
	}
	if tt := param(t, rl, "t"); tt < 1 || int64(retry) < tt {
		t.Fatalf("Retry-After %d points earlier than t=%d", retry, tt)
	}
	if h.Get("Cache-Control") != "no-store" || h.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("Cache-Control %q, Content-Type %q", h.Get("Cache-Control"), h.Get("Content-Type"))
	}
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p["type"] != ProblemQuotaExceeded || p["title"] != "Quota Exceeded" || p["status"] != float64(429) ||
		p["detail"] != "Limit is 100 requests per minute. Try again in about 1 second." {
		t.Fatalf("problem %s", w.Body)
	}
	if vp, _ := p["violated-policies"].([]any); len(vp) != 1 || vp[0] != "per-user" {
		t.Fatalf("violated-policies %v", p["violated-policies"])
	}
	if strings.Contains(w.Body.String(), "u42") {
		t.Fatalf("the problem leaks the key: %s", w.Body)
	}
}

func TestDetailSaysTheWaitInPlainWords(t *testing.T) {
	if got := about(20 * time.Second); got != "20 seconds" {
		t.Fatal(got)
	}
	if got := limitWords(sluice.Limit{Rate: 100, Period: time.Minute}, "requests"); got != "100 requests per minute" {
		t.Fatal(got)
	}
	if got := limitWords(sluice.Limit{Rate: 3, Period: 10 * time.Minute}, "requests"); got != "3 requests per 10 minutes" {
		t.Fatal(got)
	}
	if got := limitWords(sluice.Limit{Rate: 1, Period: time.Minute}, "tokens"); got != "1 token per minute" {
		t.Fatal(got)
	}
	if got := about(15 * time.Minute); got != "15 minutes" {
		t.Fatal(got)
	}
}

func TestAllowedResponsesCarryHeadersAsConfigured(t *testing.T) {
	for _, tc := range []struct {
		mode            HeaderMode
		legacy          bool
		first, nearLast bool // headers on the first response, on the 20th
	}{
		{HeadersAlways, false, true, true},
		{HeadersNearLimit, false, false, true},
		{HeadersNever, false, false, false},
		{HeadersAlways, true, true, true},
	} {
		f := newFixture(t, perUser, Options{AllowedHeaders: tc.mode, LegacyHeaders: tc.legacy})
		var first, last *httptest.ResponseRecorder
		for i := range 20 {
			w := f.do("GET", "/items", "X-User-ID", "u")
			if i == 0 {
				first = w
			}
			last = w
		}
		if got := first.Header().Get("RateLimit") != ""; got != tc.first {
			t.Errorf("mode %d: headers on the first response: %v", tc.mode, got)
		}
		if got := last.Header().Get("RateLimit") != ""; got != tc.nearLast {
			t.Errorf("mode %d: headers on the 20th response: %v", tc.mode, got)
		}
		if tc.nearLast {
			rl := sfList(t, last.Header(), "RateLimit")[0].(httpsfv.Item)
			if param(t, rl, "r") != 0 {
				t.Errorf("20th response: %q", last.Header().Get("RateLimit"))
			}
			sfList(t, last.Header(), "RateLimit-Policy")
		}
		if got := last.Header().Get("X-RateLimit-Remaining"); (got == "0") != tc.legacy || (tc.legacy && last.Header().Get("X-RateLimit-Limit") != "20") {
			t.Errorf("legacy headers %v: X-RateLimit-Remaining %q", tc.legacy, got)
		}
	}
}

func TestRetryAfterJitterNeverPointsBeforeT(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [ip], rate: 1, per: 1m}\n", Options{Jitter: 5 * time.Second})
	f.do("GET", "/")
	seen := map[string]bool{}
	for range 50 {
		w := f.do("GET", "/")
		rl := sfList(t, w.Header(), "RateLimit")[0].(httpsfv.Item)
		retry, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
		if tt := param(t, rl, "t"); retry < tt || retry > tt+5 {
			t.Fatalf("Retry-After %d with t=%d and 5s of jitter", retry, tt)
		}
		seen[w.Header().Get("Retry-After")] = true
	}
	if len(seen) < 2 {
		t.Fatalf("50 rejections all said Retry-After %v: no jitter", seen)
	}
}

func TestSeveralRulesAllAppearInThePolicy(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: per-ip, key: [ip], rate: 600, per: 1m}
  - {id: per-user, key: [user], rate: 2, per: 1s}
  - {id: trial, key: [user], rate: 1, per: 1h, mode: shadow}
`, Options{})
	w := f.do("GET", "/", "X-User-ID", "u")
	pol := sfList(t, w.Header(), "RateLimit-Policy")
	if len(pol) != 2 || pol[0].(httpsfv.Item).Value != "per-ip" || pol[1].(httpsfv.Item).Value != "per-user" {
		t.Fatalf("RateLimit-Policy %q: want per-ip and per-user, and no shadow rule", w.Header().Get("RateLimit-Policy"))
	}
	if rl := sfList(t, w.Header(), "RateLimit")[0].(httpsfv.Item); rl.Value != "per-user" || param(t, rl, "r") != 1 {
		t.Fatalf("RateLimit %q: want the rule closest to exhaustion", w.Header().Get("RateLimit"))
	}
}

func TestPenaltyLockoutIsAbnormalUsage(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, key: [ip], rate: 1, per: 1m, penalty: {after: 2, block: 15m}}\n", Options{})
	for range 3 {
		f.do("POST", "/login")
	}
	w := f.do("POST", "/login")
	var p Problem
	json.Unmarshal(w.Body.Bytes(), &p)
	if w.Code != 429 || p.Type != ProblemAbnormalUsage || p.Title != "Abnormal Usage Detected" {
		t.Fatalf("locked: %d %s", w.Code, w.Body)
	}
	if retry, _ := strconv.Atoi(w.Header().Get("Retry-After")); retry < 14*60 {
		t.Fatalf("locked for %d s, want ~15 minutes", retry)
	}
}

func TestCountOnChargesAfterTheHandlerWroteItsStatus(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, key: [ip], rate: 2, per: 15m, countOn: {status: [401]}}\n", Options{})
	for range 5 {
		if w := f.do("POST", "/login", "X-Test-Status", "200"); w.Code != 200 {
			t.Fatalf("successful login refused: %d", w.Code)
		}
	}
	for range 2 {
		f.do("POST", "/login", "X-Test-Status", "401")
	}
	if w := f.do("POST", "/login", "X-Test-Status", "200"); w.Code != 429 {
		t.Fatalf("after two failures: %d, want 429", w.Code)
	}
}

func TestLeakyQueueDelaysAndGivesBackCancelledSlots(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: q, key: [ip], rate: 10, per: 1s, burst: 2, algorithm: leaky-queue}\n", Options{MaxDelay: time.Second})
	f.do("GET", "/") // leaves at once
	start := time.Now()
	if w := f.do("GET", "/"); w.Code != 200 || time.Since(start) < 90*time.Millisecond {
		t.Fatalf("second request: %d after %v, want 200 after its 100ms in the queue", w.Code, time.Since(start))
	}
	// The clock stands still: a third request waits 200ms. Cancel it early.
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	r.RemoteAddr = "203.0.113.7:1"
	done := make(chan struct{})
	calls := f.calls
	go func() {
		defer close(done)
		// A recorder cannot be hijacked: the exchange is aborted the way
		// net/http's server expects, and which it takes without a log.
		defer func() {
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				panic(v)
			}
		}()
		f.h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	<-done
	if f.calls != calls {
		t.Fatal("a cancelled request reached the handler")
	}
	// Its slot came back: the next request waits 200ms again, not 300ms.
	var state engine.Result
	f.eng.Check(context.Background(), &rules.Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("203.0.113.7")}, engine.CheckOptions{DryRun: true}, &state)
	if state.Delay != 200*time.Millisecond {
		t.Fatalf("after the cancelled wait a new request would wait %v, want 200ms: %+v", state.Delay, state.Statuses)
	}
}

func TestDelaysBeyondTheMaximumAreRefused(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: q, key: [ip], rate: 1, per: 1s, burst: 5, algorithm: leaky-queue}\n", Options{MaxDelay: 1500 * time.Millisecond})
	f.do("GET", "/")
	f.do("GET", "/") // waits 1s
	w := f.do("GET", "/")
	if w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("a 2s delay with a 1.5s maximum: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

func TestBodyKeysAreReadAndTheBodyRestored(t *testing.T) {
	cfg, _ := rules.Parse("b.yaml", []byte("rules:\n  - {id: otp, key: [phone], rate: 1, per: 10m}\n"))
	eng, _ := engine.New(cfg, engine.Options{Store: memory.New()})
	var got []string
	h := Middleware(eng, Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	}))
	body := `{"phone":"8801700000000"}`
	for i, want := range []int{200, 429} {
		r := httptest.NewRequest("POST", "/otp", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Fatalf("OTP %d: %d, want %d", i+1, w.Code, want)
		}
	}
	if len(got) != 1 || got[0] != body {
		t.Fatalf("handler saw %q: want the whole body once (the second OTP is over the limit)", got)
	}
}

// A body longer than the part read for keys cannot give its key: another
// copy of the field could lie beyond (phone=<random> first, the victim's
// number after 64 KiB of padding, read last by PHP and Django). It is
// refused with 413, counting nothing; a body within the bound gives its
// key and reaches the handler whole.
func TestBodyKeysOfALongBodyAreRefused(t *testing.T) {
	cfg, _ := rules.Parse("b.yaml", []byte("rules:\n  - {id: otp, key: [phone], rate: 1, per: 10m}\n"))
	eng, _ := engine.New(cfg, engine.Options{Store: memory.New()})
	var sizes []int
	h := Middleware(eng, Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sizes = append(sizes, len(b))
	}))
	long := "phone=8801700000000&pad=" + strings.Repeat("x", 2*rules.MaxBodyBytes) + "&phone=8801799999999"
	short := "phone=8801700000000&pad=" // exactly MaxBodyBytes: the largest body read
	short += strings.Repeat("x", rules.MaxBodyBytes-len(short))
	for i, c := range []struct {
		body string
		want int
	}{{long, 413}, {short, 200}, {short, 429}, {long, 413}} {
		r := httptest.NewRequest("POST", "/otp", strings.NewReader(c.body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Fatalf("OTP %d with a %d-byte body: %d, want %d", i+1, len(c.body), w.Code, c.want)
		}
	}
	if len(sizes) != 1 || sizes[0] != len(short) {
		t.Fatalf("handler read %v bytes, want the whole %d once", sizes, len(short))
	}
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name, peer string
		hdr        map[string]string
		want       string
	}{
		{"socket by default", "198.51.100.1:5", map[string]string{"X-Forwarded-For": "1.2.3.4"}, "198.51.100.1"},
		{"untrusted peer's header ignored", "198.51.100.1:5", map[string]string{"X-Forwarded-For": "1.2.3.4", "Forwarded": "for=1.2.3.4"}, "198.51.100.1"},
		{"trusted peer, one hop", "10.0.0.5:5", map[string]string{"X-Forwarded-For": "203.0.113.9"}, "203.0.113.9"},
		{"right-most untrusted hop", "10.0.0.5:5", map[string]string{"X-Forwarded-For": "6.6.6.6, 203.0.113.9, 10.1.1.1"}, "203.0.113.9"},
		{"spoofed left hops do not matter", "10.0.0.5:5", map[string]string{"X-Forwarded-For": "1.1.1.1, 2.2.2.2, 203.0.113.9"}, "203.0.113.9"},
		{"malformed falls back to the socket", "10.0.0.5:5", map[string]string{"X-Forwarded-For": "203.0.113.9, not-an-ip"}, "10.0.0.5"},
		{"all trusted: the origin", "10.0.0.5:5", map[string]string{"X-Forwarded-For": "10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"Forwarded with IPv6 and port", "[fd00::1]:5", map[string]string{"Forwarded": `for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https`}, "2001:db8:cafe::17"},
		{"Forwarded wins over X-Forwarded-For", "10.0.0.5:5", map[string]string{"Forwarded": "for=192.0.2.60", "X-Forwarded-For": "6.6.6.6"}, "192.0.2.60"},
		{"obfuscated Forwarded falls back", "10.0.0.5:5", map[string]string{"Forwarded": "for=_hidden"}, "10.0.0.5"},
		{"no header", "10.0.0.5:5", nil, "10.0.0.5"},
		{"IPv4-mapped peer", "[::ffff:10.0.0.5]:5", map[string]string{"X-Forwarded-For": "203.0.113.9"}, "203.0.113.9"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.peer
		for k, v := range tc.hdr {
			r.Header.Set(k, v)
		}
		if got := ClientIP(r, trusted); got.String() != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, got, tc.want)
		}
	}
}

func TestStoreDownFailClosedIs503(t *testing.T) {
	cfg, _ := rules.Parse("c.yaml", []byte("rules:\n  - {id: otp, key: [ip], rate: 3, per: 10m, failMode: closed}\n"))
	eng, _ := engine.New(cfg, engine.Options{Store: downStore{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w := httptest.NewRecorder()
	Middleware(eng, Options{})(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("POST", "/otp", nil))
	var p Problem
	json.Unmarshal(w.Body.Bytes(), &p)
	if w.Code != 503 || p.Type != ProblemReducedCapacity || w.Header().Get("Retry-After") == "" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), "connection refused") {
		t.Fatalf("store error leaked: %s", w.Body)
	}
}

type downStore struct{}

func (downStore) Take(context.Context, []sluice.Take, []sluice.Decision) error {
	return &net_OpError{}
}

type net_OpError struct{}

func (*net_OpError) Error() string { return "dial tcp 127.0.0.1:6379: connect: connection refused" }

func BenchmarkBareHandler(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	r := httptest.NewRequest("GET", "/items", nil)
	r.Header.Set("X-User-ID", "u42")
	w := httptest.NewRecorder()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

func BenchmarkMiddleware(b *testing.B) {
	f := newFixture(b, "rules:\n  - {id: per-user, key: [user], rate: 1000000000, per: 1s}\n  - {id: per-ip, key: [ip], rate: 1000000000, per: 1s}\n", Options{})
	r := httptest.NewRequest("GET", "/items", nil)
	r.Header.Set("X-User-ID", "u42")
	w := httptest.NewRecorder()
	for b.Loop() {
		f.clock.Advance(time.Microsecond)
		clear(w.Header())
		f.h.ServeHTTP(w, r)
	}
}

// Every field sluice emits parses as a structured field: the lists as lists,
// the integers as items.
func TestEveryEmittedHeaderParsesAsAStructuredField(t *testing.T) {
	f := newFixture(t, perUser, Options{LegacyHeaders: true, Jitter: time.Second})
	var last *httptest.ResponseRecorder
	for range 22 {
		last = f.do("GET", "/", "X-User-ID", "u")
	}
	h := last.Header()
	for _, name := range []string{"Ratelimit-Policy", "Ratelimit"} {
		sfList(t, h, name)
	}
	for _, name := range []string{"Retry-After", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
		it, err := httpsfv.UnmarshalItem(h.Values(name))
		if err != nil {
			t.Fatalf("%s: %q: %v", name, h.Values(name), err)
		}
		if n, ok := it.Value.(int64); !ok || n < 0 {
			t.Fatalf("%s: %v is not a non-negative integer", name, it.Value)
		}
	}
}

func TestWorksWithTheStandardMux(t *testing.T) {
	cfg, _ := rules.Parse("m.yaml", []byte("rules:\n  - {id: users, match: {method: GET, path: \"/users/{id}\"}, key: [route, ip], rate: 1, per: 1m}\n"))
	eng, _ := engine.New(cfg, engine.Options{Store: memory.New()})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.PathValue("id")) })
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	srv := httptest.NewServer(Middleware(eng, Options{})(mux))
	defer srv.Close()
	codes := []int{}
	for _, path := range []string{"/users/1", "/users/2", "/health", "/health"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	// One route per client: /users/2 shares /users/1's count; /health is not limited.
	if fmt.Sprint(codes) != "[200 429 200 200]" {
		t.Fatalf("codes %v", codes)
	}
}

// clientIP: {depth: N} takes the N-th X-Forwarded-For address from the
// right, as Traefik's ipStrategy.depth does, but only behind a trusted
// proxy: a client talking to sluice directly cannot choose its address.
func TestClientIPAtDepth(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		peer, xff string
		depth     int
		want      string
	}{
		{"10.0.0.1:1", "198.51.100.9, 203.0.113.5, 10.0.0.7", 1, "10.0.0.7"},
		{"10.0.0.1:1", "198.51.100.9, 203.0.113.5, 10.0.0.7", 2, "203.0.113.5"},
		{"10.0.0.1:1", "198.51.100.9, 203.0.113.5, 10.0.0.7", 3, "198.51.100.9"},
		{"10.0.0.1:1", "198.51.100.9, 203.0.113.5", 5, "198.51.100.9"}, // fewer hops: the leftmost
		{"192.0.2.1:1", "198.51.100.9, 203.0.113.5", 2, "192.0.2.1"},   // untrusted peer: its own address
		{"10.0.0.1:1", "", 2, "10.0.0.1"},                              // no chain
		{"10.0.0.1:1", "not an address", 1, "10.0.0.1"},                // a malformed chain
	} {
		r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := ClientIPAtDepth(r, trusted, tc.depth); got.String() != tc.want {
			t.Errorf("peer %s, X-Forwarded-For %q, depth %d: %s, want %s", tc.peer, tc.xff, tc.depth, got, tc.want)
		}
	}
	// Through the middleware, from the rule file's clientIP section.
	f := newFixture(t, "trustedProxies: [10.0.0.0/8]\nclientIP: {depth: 2}\nrules:\n  - {id: per-ip, key: [ip], rate: 1, per: 1h}\n", Options{})
	codes := ""
	for _, xff := range []string{"198.51.100.1, 203.0.113.5, 10.0.0.7", "198.51.100.2, 203.0.113.5, 10.0.0.8", "203.0.113.6, 10.0.0.7"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.1:1234"
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		codes += fmt.Sprint(w.Code, " ")
	}
	if codes != "200 429 200 " { // the first two share 203.0.113.5 at depth 2
		t.Fatalf("codes %s", codes)
	}
}

// A refusal's detail names what the rule counts: its unit, "units" for a
// rule whose requests cost more than one, else requests.
func TestDetailNamesWhatTheRuleCounts(t *testing.T) {
	for _, c := range []struct{ rule, want string }{
		{"{id: t, key: [user], rate: 1000, per: 1m, unit: tokens, cost: 600}", "Limit is 1000 tokens per minute."},
		{"{id: t, key: [user], rate: 1000, per: 1m, cost: 600}", "Limit is 1000 units per minute."},
		{"{id: t, key: [user], rate: 1, per: 1m}", "Limit is 1 request per minute."},
	} {
		cfg, err := rules.Parse("u.yaml", []byte("rules:\n  - "+c.rule+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(cfg, engine.Options{Store: memory.New()})
		if err != nil {
			t.Fatal(err)
		}
		var res engine.Result
		req := &rules.Request{Attributes: map[string]string{"user": "u"}}
		for range 2 {
			e.Check(context.Background(), req, engine.CheckOptions{}, &res)
		}
		if res.Allowed || !strings.HasPrefix(ProblemFor(&res).Detail, c.want) {
			t.Errorf("%s: %q, want it to start %q", c.rule, ProblemFor(&res).Detail, c.want)
		}
	}
	if _, err := rules.Parse("u.yaml", []byte("rules:\n  - {id: t, key: [user], rate: 1, per: 1m, unit: \"tokens; drop\"}\n")); err == nil {
		t.Error("a unit with punctuation loaded")
	}
}

// Waits are said in round words, rounded up, at each unit's edges.
func TestWaitsAreSaidRoundedUp(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Second:               "1 second",
		119 * time.Second:         "119 seconds",
		120 * time.Second:         "2 minutes",
		121 * time.Second:         "3 minutes",
		2*time.Hour - time.Second: "120 minutes",
		2 * time.Hour:             "2 hours",
		2*time.Hour + time.Second: "3 hours",
		50 * time.Hour:            "50 hours",
	} {
		if got := about(d); got != want {
			t.Errorf("about(%v) = %q, want %q", d, got, want)
		}
	}
}

// A settle reads the body's number up to MaxSettleBody bytes, not one more.
func TestJSONNumberUpToMaxSettleBody(t *testing.T) {
	doc := []byte(`{"usage":{"total_tokens":42}}`)
	for _, tc := range []struct {
		size int
		ok   bool
	}{{MaxSettleBody, true}, {MaxSettleBody + 1, false}} {
		body := append(bytes.Repeat([]byte{' '}, tc.size-len(doc)), doc...)
		n, ok := jsonNumber(body, []string{"usage", "total_tokens"})
		if ok != tc.ok || ok && n != 42 {
			t.Errorf("a body of %d bytes: %d, %v; want found %v", tc.size, n, ok, tc.ok)
		}
	}
}

// The pressure adaptive rules follow is sampled from the answers to the
// requests they apply to, and only those: 200s of an adaptive rule leave it
// at 1 (each answer seen, and seen as a success), 500s of another rule's
// requests are not sampled.
func TestPressureSamplesAdaptiveRequestsOnly(t *testing.T) {
	now := epoch
	p := concurrency.NewPressure(concurrency.PressureOptions{Now: func() time.Time { return now }})
	f := newFixture(t, `
rules:
  - {id: adaptive, match: {path: /a}, key: [user], rate: 1000, per: 1m, adaptive: true}
  - {id: plain, match: {path: /p}, key: [user], rate: 1000, per: 1m}
`, Options{Pressure: p})
	for i := range 50 {
		user := fmt.Sprint("u", i)
		if w := f.do("GET", "/a", "X-User-Id", user); w.Code != 200 {
			t.Fatalf("adaptive request: %d", w.Code)
		}
		f.do("GET", "/p", "X-User-Id", user, "X-Test-Status", "500")
	}
	now = now.Add(10 * time.Second)
	if got := p.Measured(); got != 1 {
		t.Fatalf("pressure %v after 50 answered adaptive requests and 50 failing plain ones, want 1", got)
	}
	for i := range 50 { // failures of the adaptive rule's requests do count
		f.do("GET", "/a", "X-User-Id", fmt.Sprint("u", i), "X-Test-Status", "500")
	}
	now = now.Add(10 * time.Second)
	if got := p.Measured(); got >= 1 {
		t.Fatalf("pressure %v after 50 failing adaptive requests, want below 1", got)
	}
}

// recordingTracer is a Tracer that records each decision's via, the trace
// context it was given, and what the span was ended with.
type recordingTracer struct {
	mu    sync.Mutex
	spans []recordedSpan
}

type recordedSpan struct {
	via, traceparent string
	allowed, ended   bool
}

func (r *recordingTracer) StartDecision(ctx context.Context, via string, h HeaderCarrier) (context.Context, DecisionSpan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, recordedSpan{via: via, traceparent: h.Get("traceparent")})
	return ctx, spanEnder{r, len(r.spans) - 1}
}

type spanEnder struct {
	r *recordingTracer
	i int
}

func (s spanEnder) End(res *engine.Result, _ error) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	s.r.spans[s.i].allowed, s.r.spans[s.i].ended = res.Allowed, true
}

// With a Tracer, each decision is a span, given the request's trace
// context and ended with its outcome (package tracing makes OpenTelemetry
// spans of them; its tests and server's check those).
func TestEachDecisionIsASpan(t *testing.T) {
	rec := &recordingTracer{}
	f := newFixture(t, perUser, Options{Tracer: rec})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for range 2 {
		f.do("GET", "/", "X-User-Id", "u1", "Traceparent", tp)
	}
	if len(rec.spans) != 2 {
		t.Fatalf("%d spans for 2 decisions", len(rec.spans))
	}
	for _, s := range rec.spans {
		if s.via != "http" || s.traceparent != tp || !s.ended || !s.allowed {
			t.Fatalf("span %+v: want via http (the default), the request's traceparent, ended allowed", s)
		}
	}
}

// A client of the pressure signal is an IPv4 address, or an IPv6 one by
// the prefix the rules count it by: two addresses of one /64 are one client
// at 64, two at 128 or with no prefix; distinct networks are distinct.
func TestClientIDsFollowTheIPv6Prefix(t *testing.T) {
	a := netip.MustParseAddr
	same := func(x, y string, prefix int) bool { return clientID(a(x), prefix) == clientID(a(y), prefix) }
	for _, tc := range []struct {
		x, y   string
		prefix int
		same   bool
	}{
		{"203.0.113.1", "203.0.113.2", 64, false},
		{"::ffff:203.0.113.1", "203.0.113.1", 64, true},
		{"2001:db8:1:1::1", "2001:db8:1:1::2", 64, true},
		{"2001:db8:1:1::1", "2001:db8:1:1::2", 128, false},
		{"2001:db8:1:1::1", "2001:db8:1:1::2", 0, false},
		{"2001:db8:1::1", "2001:db8:2::1", 64, false},
	} {
		if got := same(tc.x, tc.y, tc.prefix); got != tc.same {
			t.Errorf("%s and %s at /%d: one client %v, want %v", tc.x, tc.y, tc.prefix, got, tc.same)
		}
	}
}

// The settle reads a JSON answer of up to MaxSettleBody bytes, whole; a
// larger one is not read and the estimate stands.
func TestTheMiddlewareSettlesFromAnAnswerUpToMaxSettleBody(t *testing.T) {
	doc := `{"usage":{"total_tokens":30}}`
	for _, tc := range []struct {
		size int
		left int64
	}{{MaxSettleBody, 1000 - 30}, {MaxSettleBody + 1, 1000 - 100}} {
		cfg, err := rules.Parse("test.yaml", []byte("rules:\n  - {id: tokens, key: [user], rate: 1000, per: 1h, algorithm: fixed-window, reserve: {estimate: 100, actualJSON: usage.total_tokens}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		eng, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch)))})
		if err != nil {
			t.Fatal(err)
		}
		body := strings.Repeat(" ", tc.size-len(doc)) + doc
		h := Middleware(eng, Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body[:len(body)/2]) // in two writes
			io.WriteString(w, body[len(body)/2:])
		}))
		r := httptest.NewRequest("POST", "/v1/chat", nil)
		r.Header.Set("X-User-Id", "u")
		h.ServeHTTP(httptest.NewRecorder(), r)
		if d, _, _ := eng.Inspect(context.Background(), "tokens", "u"); d.Remaining != tc.left {
			t.Errorf("an answer of %d bytes: %d left, want %d", tc.size, d.Remaining, tc.left)
		}
	}
}

// The answer kept for a settle is bounded: MaxSettleBody bytes and one
// more (to tell a larger answer), however much the handler writes.
func TestTheKeptAnswerIsBounded(t *testing.T) {
	sw := &statusWriter{ResponseWriter: httptest.NewRecorder(), keep: true}
	chunk := make([]byte, 1<<20)
	for range 2 * MaxSettleBody / len(chunk) {
		sw.Write(chunk)
	}
	if len(sw.body) != MaxSettleBody+1 {
		t.Fatalf("kept %d bytes of a %d-byte answer, want %d", len(sw.body), 2*MaxSettleBody, MaxSettleBody+1)
	}
}

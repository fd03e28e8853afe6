package httplimit

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/concurrency"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// The near-limit header mode: NearLimit defaults to 20% of the burst, and a
// key at exactly that share gets the headers.
func TestNearLimitHeadersDefaultAndBoundary(t *testing.T) {
	src := "rules:\n  - {id: r, key: [ip], rate: 10, per: 1h}\n"
	f := newFixture(t, src, Options{AllowedHeaders: HeadersNearLimit})
	var got []bool
	for range 9 {
		got = append(got, f.do("GET", "/").Header().Get("Ratelimit") != "")
	}
	// Remaining after each: 9 8 7 6 5 4 3 2 1: headers from 2 (= 20% of 10) on.
	want := []bool{false, false, false, false, false, false, false, true, true}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("headers per request %v, want %v", got, want)
		}
	}
	g := newFixture(t, src, Options{AllowedHeaders: HeadersNearLimit, NearLimit: 0.5})
	for i := range 6 {
		has := g.do("GET", "/").Header().Get("Ratelimit") != ""
		if has != (i >= 4) { // remaining 5 after the 5th
			t.Fatalf("NearLimit 0.5, request %d: headers %v", i+1, has)
		}
	}
}

// MaxDelay defaults to 10 s; a delay of exactly MaxDelay is served, a longer
// one refused.
func TestLeakyQueueMaxDelayDefaultAndBoundary(t *testing.T) {
	q := "rules:\n  - {id: q, key: [ip], rate: 1000, per: 1s, burst: 3, algorithm: leaky-queue}\n"
	f := newFixture(t, q, Options{})
	for i := range 3 {
		if w := f.do("GET", "/"); w.Code != 200 {
			t.Fatalf("request %d with a 1ms queue wait under the default MaxDelay: %d", i+1, w.Code)
		}
	}
	slow := "rules:\n  - {id: q, key: [ip], rate: 10, per: 1s, burst: 3, algorithm: leaky-queue}\n"
	g := newFixture(t, slow, Options{MaxDelay: 100 * time.Millisecond})
	g.do("GET", "/") // leaves at once
	if w := g.do("GET", "/"); w.Code != 200 {
		t.Fatalf("a wait of exactly MaxDelay (100ms) was refused: %d", w.Code)
	}
	if w := g.do("GET", "/"); w.Code != 429 {
		t.Fatalf("a wait of 200ms over MaxDelay 100ms: %d, want 429", w.Code)
	}
}

// A rejection that waiting cannot cure (a missing key) carries no
// Retry-After.
func TestNoRetryAfterWhenWaitingCannotHelp(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 5, per: 1h, onMissingKey: reject}\n", Options{})
	w := f.do("GET", "/")
	if w.Code != 400 || w.Header().Get("Retry-After") != "" {
		t.Fatalf("missing key: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

// Jitter adds at most its own length to Retry-After, however small.
func TestJitterOfOneNanosecond(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [ip], rate: 1, per: 10s}\n", Options{Jitter: 1})
	f.do("GET", "/")
	for range 20 {
		w := f.do("GET", "/")
		if ra := w.Header().Get("Retry-After"); ra != "10" && ra != "11" {
			t.Fatalf("Retry-After %q, want 10 or 11", ra)
		}
	}
}

// RewritePath hands the next handler the normalised path that was limited.
func TestRewritePathServesWhatWasLimited(t *testing.T) {
	cfg, err := rules.Parse("t.yaml", []byte("rules:\n  - {id: r, key: [ip], rate: 100, per: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var seen []string
	h := Middleware(e, Options{RewritePath: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.Path+"|"+r.URL.EscapedPath())
	}))
	for _, p := range []string{"//a/./b/../c", "/%6Ftp", "/plain"} {
		r := httptest.NewRequest("GET", p, nil)
		r.RemoteAddr = "203.0.113.7:1"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	want := "/a/c|/a/c /otp|/otp /plain|/plain"
	if strings.Join(seen, " ") != want {
		t.Fatalf("next saw %q, want %q", strings.Join(seen, " "), want)
	}
}

// A body key source reads the body and leaves it whole for the handler.
func TestBodyKeysThroughTheMiddleware(t *testing.T) {
	cfg, err := rules.Parse("t.yaml", []byte("rules:\n  - {id: otp, key: [phone], rate: 1, per: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var bodies []string
	h := Middleware(e, Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
	}))
	var codes []int
	for _, b := range []string{`{"phone":"1"}`, `{"phone":"1"}`, `{"phone":"2"}`} {
		r := httptest.NewRequest("POST", "/otp", strings.NewReader(b))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if codes[0] != 200 || codes[1] != 429 || codes[2] != 200 {
		t.Fatalf("codes %v, want 200 429 200", codes)
	}
	if len(bodies) != 2 || bodies[0] != `{"phone":"1"}` || bodies[1] != `{"phone":"2"}` {
		t.Fatalf("the handler read %q", bodies)
	}
}

// The policy cache never serves another rule set's policy.
func TestPolicyHeaderFollowsTheRule(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: a, match: {path: /a}, key: [ip], rate: 5, per: 1h}\n  - {id: b, match: {path: /b}, key: [ip], rate: 7, per: 1m}\n", Options{})
	for range 3 {
		if p := f.do("GET", "/a").Header().Get("Ratelimit-Policy"); p != `"a";q=5;w=3600` {
			t.Fatalf("/a policy %q", p)
		}
		if p := f.do("GET", "/b").Header().Get("Ratelimit-Policy"); p != `"b";q=7;w=60` {
			t.Fatalf("/b policy %q", p)
		}
	}
}

// An allowed response says how much is left, not when to come back: no t.
func TestAllowedResponsesCarryNoT(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [ip], rate: 5, per: 1h}\n", Options{})
	if rl := f.do("GET", "/").Header().Get("Ratelimit"); rl != `"r";r=4` {
		t.Fatalf("RateLimit %q, want \"r\";r=4", rl)
	}
}

// Without Options.TrustedProxies, the rule file's trustedProxies decide
// whose forwarding headers are believed.
func TestRuleFileTrustedProxiesAreUsed(t *testing.T) {
	f := newFixture(t, "trustedProxies: [203.0.113.0/24]\nrules:\n  - {id: r, key: [ip], rate: 1, per: 1h}\n", Options{})
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		if w := f.do("GET", "/", "X-Forwarded-For", client); w.Code != 200 {
			t.Fatalf("client %s behind the trusted proxy: %d (counted as the proxy?)", client, w.Code)
		}
	}
}

// The limit a response advertises is the quota its remaining counts down:
// the burst for the bucket family (5 at once, then 1 per second, is q=5 and
// w=5, with 4 left after one request), the rate for the windows, and in
// requests when a request costs more than one unit.
func TestAdvertisedQuotaIsWhatRemainingCounts(t *testing.T) {
	for _, tc := range []struct {
		name, rule        string
		policy, rateLimit string
		legacyLimit       string
		legacyRemaining   string
	}{
		{"bucket", "{id: b, key: [ip], rate: 1, per: 1s, burst: 5}", `"b";q=5;w=5`, `"b";r=4`, "5", "4"},
		{"gcra", "{id: g, key: [ip], rate: 7, per: 1m}", `"g";q=7;w=60`, `"g";r=6`, "7", "6"},
		{"window", "{id: w, key: [ip], rate: 10, per: 1m, algorithm: fixed-window}", `"w";q=10;w=60`, `"w";r=9`, "10", "9"},
		{"cost", "{id: c, key: [ip], rate: 1000, per: 1h, cost: 50}", `"c";q=20;w=3600`, `"c";r=19`, "20", "19"},
		{"cost and burst", "{id: cb, key: [ip], rate: 100, per: 1m, burst: 300, cost: 30}", `"cb";q=10;w=180`, `"cb";r=9`, "10", "9"},
		{"window and cost", "{id: wc, key: [ip], rate: 100, per: 1m, algorithm: fixed-window, cost: 10}", `"wc";q=10;w=60`, `"wc";r=9`, "10", "9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "rules:\n  - "+tc.rule+"\n", Options{LegacyHeaders: true, AllowedHeaders: HeadersAlways})
			h := f.do("GET", "/").Header()
			if got := h.Get("Ratelimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tc.policy)
			}
			if got := h.Get("Ratelimit"); got != tc.rateLimit {
				t.Errorf("RateLimit %q, want %q", got, tc.rateLimit)
			}
			if got := h.Get("X-Ratelimit-Limit"); got != tc.legacyLimit {
				t.Errorf("X-RateLimit-Limit %q, want %q", got, tc.legacyLimit)
			}
			if got := h.Get("X-Ratelimit-Remaining"); got != tc.legacyRemaining {
				t.Errorf("X-RateLimit-Remaining %q, want %q", got, tc.legacyRemaining)
			}
		})
	}
}

// With a concurrency limit, requests the rules admit take a permit; beyond
// the limit they are answered 503 temporary-reduced-capacity at once, and
// a 5xx from the handler counts as dropped.
func TestConcurrencyOption(t *testing.T) {
	lim := concurrency.New(concurrency.Fixed{N: 2}, concurrency.Options{})
	f := newFixture(t, "rules:\n  - {id: a, key: [ip], rate: 1000, per: 1s}\n", Options{Concurrency: lim})
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	f.h = Middleware(f.eng, Options{Concurrency: lim})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(200)
	}))
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { f.do("GET", "/", "X-Hold", "1") })
	}
	<-entered
	<-entered
	w := f.do("GET", "/")
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "temporary-reduced-capacity") || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("a third request over a limit of 2: %d %v %s", w.Code, w.Header(), w.Body)
	}
	close(release)
	wg.Wait()
	if lim.InFlight() != 0 {
		t.Fatalf("%d permits not given back", lim.InFlight())
	}
	if w := f.do("GET", "/"); w.Code != 200 {
		t.Fatalf("after the others finished: %d", w.Code)
	}
}

// An answer that says the handler is overloaded or out of reach (502, 503,
// 504) counts as dropped: an AIMD limit backs off on it, and grows on other
// answers that use it, 500 included (a client can provoke errors of its
// own at will: they say nothing of capacity).
func TestConcurrencyOptionCountsOverloadAnswersAsDropped(t *testing.T) {
	for _, tc := range []struct {
		status int
		grows  bool
	}{{200, true}, {503, false}, {502, false}, {504, false}, {500, true}, {499, true}} {
		lim := concurrency.New(concurrency.AIMD{Start: 2, Backoff: 0.5}, concurrency.Options{Min: 1, Max: 100})
		f := newFixture(t, "rules:\n  - {id: a, key: [ip], rate: 1000, per: 1s}\n", Options{Concurrency: lim})
		f.h = Middleware(f.eng, Options{Concurrency: lim})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(tc.status) }))
		for range 4 {
			f.do("GET", "/")
		}
		if grew := lim.Limit() > 2; grew != tc.grows {
			t.Errorf("status %d: limit %d from 2, want grown %v", tc.status, lim.Limit(), tc.grows)
		}
	}
}

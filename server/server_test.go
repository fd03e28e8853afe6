package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/gateway"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/metrics"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/storecall"
)

const testRules = `
trustedProxies: [192.0.2.0/24]
rules:
  - {id: login, match: {method: POST, path: /login}, key: [user, ip], rate: 2, per: 15m}
  - {id: per-user, key: [user], rate: 100, per: 1m, burst: 20}
  - {id: otp, key: [phone], rate: 1, per: 10m, onMissingKey: skip}
`

type fixture struct {
	srv   *Server
	clock *sluice.ManualClock
}

func newFixture(t testing.TB, o Options) *fixture {
	t.Helper()
	return newFixtureOf(t, testRules, o)
}

func newFixtureOf(t testing.TB, src string, o Options) *fixture {
	t.Helper()
	cfg, err := rules.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	mem := memory.New(memory.WithClock(clock))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Metrics = metrics.New("test")
	eo := engine.Options{Store: mem, Logger: quiet, Calls: storecall.Options{OnCall: o.Metrics.ObserveStoreCall}}
	if o.Overrides != nil {
		eo.Overrides = o.Overrides.Current
	}
	e, err := engine.New(cfg, eo)
	if err != nil {
		t.Fatal(err)
	}
	o.Engine, o.Memory = e, mem
	if o.Logger == nil {
		o.Logger = quiet
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{srv: s, clock: clock}
}

func (f *fixture) do(method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Host = "127.0.0.1:8080" // as a client on the machine addresses a loopback listener
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			r.Host = hdr[i+1]
			continue
		}
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.srv.ServeHTTP(w, r)
	return w
}

const loginCheck = `{"request":{"method":"POST","path":"/login","host":"api.example","ip":"203.0.113.7","headers":{"X-User-ID":"u42"}},"cost":1}`

func TestCheckAnswersAsDocumented(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	for range 2 {
		if w := f.do("POST", "/v1/check", loginCheck); w.Code != 200 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	w := f.do("POST", "/v1/check", loginCheck)
	var resp CheckResponse
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	if w.Code != 200 || resp.Allowed || resp.Rule != "login" || resp.Reason != "limited" || resp.RetryAfterMs != 450_000 {
		t.Fatalf("%d %+v", w.Code, resp)
	}
	if len(resp.Statuses) != 3 || resp.Statuses[0].Rule != "login" || resp.Statuses[0].PeriodSeconds != 900 || resp.Statuses[0].Limit != 2 {
		t.Fatalf("statuses %+v", resp.Statuses)
	}
	// The request has no phone: otp did not apply, and the answer says so.
	if st := resp.Statuses[2]; st.Rule != "otp" || !st.Allowed || st.Reason != "missing-key" || st.Remaining != -1 {
		t.Fatalf("a rule skipped for a missing key: %+v", st)
	}
	if resp.Headers["Retry-After"] != "450" || !strings.HasPrefix(resp.Headers["RateLimit"], `"login";r=0;t=450`) ||
		!strings.Contains(resp.Headers["RateLimit-Policy"], `"login";q=2;w=900`) {
		t.Fatalf("headers %v", resp.Headers)
	}
	// attributes supply keys directly; dryRun consumes nothing.
	for range 3 {
		w = f.do("POST", "/v1/check", `{"attributes":{"phone":"8801700000000"},"dryRun":true}`)
		json.Unmarshal(w.Body.Bytes(), &resp)
		if !resp.Allowed {
			t.Fatalf("dry run: %+v", resp)
		}
	}
}

func TestBadRequestsAre400ProblemsNamingTheField(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	for _, tc := range []struct{ body, field, detail string }{
		{`{`, "", "malformed JSON"},
		{``, "", "empty body"},
		{`{"colour":"red"}`, "colour", "unknown field"},
		{`{"request":{"method":5}}`, "request.method", "want a string"},
		{`{"cost":"one"}`, "cost", "want an integer"},
		{`{"cost":0}`, "cost", "must be >= 1"},
		{`{"request":{"ip":"300.1.1.1"}}`, "request.ip", "not an IP"},
		{`{"request":{"path":"login"}}`, "request.path", "must start with /"},
		{`{} {}`, "", "trailing data"},
		// Names as written, once: encoding/json alone takes "COST" for
		// "cost" and the last of two members.
		{`{"COST":2}`, "COST", `case-sensitive: "cost"`},
		{`{"cost":1,"cost":5}`, "cost", "given twice"},
		{`{"request":{"PATH":"/x"}}`, "request.PATH", "case-sensitive"},
		{`{"request":{"path":"/a"},"request":{"path":"/b"}}`, "request", "given twice"},
		{`{"request":{"method":"GET","method":"POST"}}`, "request.method", "given twice"},
	} {
		w := f.do("POST", "/v1/check", tc.body)
		var p httplimit.Problem
		json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != 400 || w.Header().Get("Content-Type") != "application/problem+json" || p.Status != 400 ||
			p.Field != tc.field || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("%s: %d %s", tc.body, w.Code, w.Body)
		}
	}
	if w := f.do("POST", "/v1/check", `{"attributes":{"x":"`+strings.Repeat("a", maxBody)+`"}}`); w.Code != 413 {
		t.Errorf("oversized body: %d", w.Code)
	}
	if w := f.do("POST", "/v1/check:batch", `[{"cost":1},{"Cost":2}]`); w.Code != 400 || !strings.Contains(w.Body.String(), "case-sensitive") {
		t.Errorf("a batch's second check spelled Cost: %d %s", w.Code, w.Body)
	}
	if w := f.do("POST", "/v1/charge", `{"status":401,"status":200}`); w.Code != 400 || !strings.Contains(w.Body.String(), "given twice") {
		t.Errorf("a charge's status given twice: %d %s", w.Code, w.Body)
	}
	if w := f.do("GET", "/v1/check", ""); w.Code != 405 {
		t.Errorf("GET /v1/check: %d", w.Code)
	}
}

func TestBatchChecksInOrder(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	w := f.do("POST", "/v1/check:batch", `[{"attributes":{"phone":"1"}},{"attributes":{"phone":"1"}},{"attributes":{"phone":"2"}}]`)
	var out []CheckResponse
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if len(out) != 3 || !out[0].Allowed || out[1].Allowed || !out[2].Allowed {
		t.Fatalf("batch %+v", out)
	}
	w = f.do("POST", "/v1/check:batch", `[{"attributes":{"phone":"1"}},{"cost":-1}]`)
	var p httplimit.Problem
	json.Unmarshal(w.Body.Bytes(), &p)
	if w.Code != 400 || p.Field != "[1].cost" {
		t.Fatalf("bad batch item: %d %s", w.Code, w.Body)
	}
}

func TestForwardAuthForTrustedProxies(t *testing.T) {
	f := newFixture(t, Options{Loopback: true, AuthProxy: AuthTraefik})
	auth := func(peer string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/v1/auth", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-Method", "POST")
		r.Header.Set("X-Forwarded-Uri", "/login?next=/home")
		r.Header.Set("X-Forwarded-For", "203.0.113.7")
		r.Header.Set("X-User-ID", "u42")
		w := httptest.NewRecorder()
		f.srv.ServeHTTP(w, r)
		return w
	}
	for range 2 {
		if w := auth("192.0.2.10:4000"); w.Code != 200 || w.Header().Get("Ratelimit") == "" {
			t.Fatalf("allowed forward-auth: %d %v", w.Code, w.Header())
		}
	}
	w := auth("192.0.2.10:4000")
	if w.Code != 429 || w.Header().Get("Retry-After") != "450" || !strings.Contains(w.Body.String(), "quota-exceeded") {
		t.Fatalf("limited forward-auth: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if w := auth("198.51.100.1:4000"); w.Code != 403 {
		t.Fatalf("untrusted peer: %d", w.Code)
	}
	// nginx (the default): X-Original-URI, X-Original-Method, X-Real-IP;
	// the X-Forwarded-* and Forwarded headers a client passes through are
	// not read.
	n := newFixture(t, Options{Loopback: true})
	r := httptest.NewRequest("GET", "/v1/auth", nil)
	r.RemoteAddr = "192.0.2.10:4000"
	r.Header.Set("X-Original-Method", "POST")
	r.Header.Set("X-Original-URI", "/login")
	r.Header.Set("X-Real-IP", "203.0.113.99")
	r.Header.Set("X-Forwarded-Uri", "/other")
	r.Header.Set("Forwarded", "for=9.9.9.9")
	r.Header.Set("X-User-ID", "u42")
	w = httptest.NewRecorder()
	n.srv.ServeHTTP(w, r)
	if w.Code != 200 || !strings.Contains(w.Header().Get("Ratelimit"), `"login";r=1`) {
		t.Fatalf("nginx headers: %d %v", w.Code, w.Header())
	}
}

// Behind Traefik or Caddy, a client's Forwarded header and the left of its
// X-Forwarded-For chain are never believed.
func TestForwardAuthIgnoresClientForwardingHeaders(t *testing.T) {
	for _, proxy := range []AuthProxy{AuthTraefik, AuthCaddy, AuthEnvoy} {
		f := newFixture(t, Options{Loopback: true, AuthProxy: proxy})
		var got []string
		for i := range 3 {
			r := httptest.NewRequest("POST", "/v1/auth/login", nil)
			r.RemoteAddr = "192.0.2.10:4000"
			r.Header.Set("X-Forwarded-Method", "POST")
			r.Header.Set("X-Forwarded-Uri", "/login")
			// The client spoofs a new address each time; the proxy appends
			// the real one.
			r.Header.Set("Forwarded", fmt.Sprintf("for=9.9.9.%d", i))
			r.Header.Set("X-Forwarded-For", fmt.Sprintf("9.9.9.%d, 203.0.113.7", i))
			r.Header.Set("X-Original-URI", "/other")
			r.Header.Set("X-User-ID", "u42") // login counts per user and IP
			w := httptest.NewRecorder()
			f.srv.ServeHTTP(w, r)
			got = append(got, fmt.Sprint(w.Code, " ", w.Header().Get("Ratelimit")))
		}
		if !strings.HasPrefix(got[2], "429") {
			t.Errorf("%s: the spoofed addresses got separate counts: %q", proxy, got)
		}
	}
}

func TestAdminNeedsATokenOffLoopback(t *testing.T) {
	open := newFixture(t, Options{Loopback: true})
	if w := open.do("GET", "/v1/rules", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"id":"login"`) {
		t.Fatalf("loopback, no token: %d %s", w.Code, w.Body)
	} else if v := w.Header().Get("Sluice-Rules-Version"); v != open.srv.e.Config().Version || !strings.HasPrefix(v, "sha256:") {
		t.Fatalf("Sluice-Rules-Version %q, want the rules' %q", v, open.srv.e.Config().Version)
	}
	closed := newFixture(t, Options{Loopback: false})
	if w := closed.do("GET", "/v1/rules", ""); w.Code != 403 {
		t.Fatalf("non-loopback, no token: %d", w.Code)
	}
	tok := newFixture(t, Options{Loopback: false, AdminToken: "s3cret"})
	if w := tok.do("GET", "/v1/rules", "", "Authorization", "Bearer wrong"); w.Code != 401 {
		t.Fatalf("wrong token: %d", w.Code)
	}
	for _, h := range []string{"Bearer s3cret", "bearer s3cret", "BEARER s3cret"} { // the scheme is case-insensitive
		if w := tok.do("GET", "/v1/rules", "", "Authorization", h); w.Code != 200 {
			t.Fatalf("right token as %q: %d", h, w.Code)
		}
	}
	for _, h := range []string{"Basic s3cret", "Bearer s3cret ", "Bearer  s3cret", "Bearers3cret", "s3cret", "Bearer S3CRET"} {
		if w := tok.do("GET", "/v1/rules", "", "Authorization", h); w.Code != 401 {
			t.Fatalf("%q: %d, want 401", h, w.Code)
		}
	}
}

func TestStateInspectAndReset(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	f.do("POST", "/v1/check", `{"attributes":{"phone":"555"}}`)
	w := f.do("GET", "/v1/state?rule=otp&key=555", "")
	var st StateJSON
	json.Unmarshal(w.Body.Bytes(), &st)
	if w.Code != 200 || st.Remaining != 0 || st.ResetAfterMs != 600_000 {
		t.Fatalf("state: %d %s", w.Code, w.Body)
	}
	if w := f.do("DELETE", "/v1/state?rule=otp&key=555", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"reset":true`) {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	var resp CheckResponse
	json.Unmarshal(f.do("POST", "/v1/check", `{"attributes":{"phone":"555"}}`).Body.Bytes(), &resp)
	if !resp.Allowed {
		t.Fatal("a reset key is still limited")
	}
	if w := f.do("GET", "/v1/state?rule=nope&key=1", ""); w.Code != 404 {
		t.Fatalf("unknown rule: %d", w.Code)
	}
	if w := f.do("GET", "/v1/state?rule=otp", ""); w.Code != 400 {
		t.Fatalf("no key: %d", w.Code)
	}
}

// /v1/state takes a key as a user writes it: the values of the rule's key
// sources by name, an address counted by its IPv6 prefix, a hashed source
// hashed by sluice; and it says how long a penalty lock has left.
func TestStateTakesKeySourceValues(t *testing.T) {
	f := newFixtureOf(t, `
keys:
  api_key: {header: Authorization, scheme: Bearer, hash: true}
rules:
  - {id: login, key: [user, ip], rate: 1, per: 1h, penalty: {after: 2, block: 15m}}
  - {id: per-key, key: [api_key], rate: 5, per: 1m}
`, Options{Loopback: true})
	for range 3 {
		f.do("POST", "/v1/check", `{"request":{"ip":"2001:db8::7","headers":{"X-User-ID":"u42","Authorization":"Bearer s3cret"}}}`)
	}
	var st StateJSON
	w := f.do("GET", "/v1/state?rule=login&user=u42&ip=2001:db8::9", "") // the same /64
	json.Unmarshal(w.Body.Bytes(), &st)
	if w.Code != 200 || st.Remaining != 0 || !st.Locked || st.LockedForMs != 15*60*1000 {
		t.Fatalf("login for u42 from 2001:db8::/64: %d %s", w.Code, w.Body)
	}
	w = f.do("GET", "/v1/state?rule=per-key&api_key=s3cret", "")
	st = StateJSON{}
	json.Unmarshal(w.Body.Bytes(), &st)
	if w.Code != 200 || st.Remaining != 4 || strings.Contains(w.Body.String(), "s3cret") || st.Locked { // login refused the other two: only the first charged
		t.Fatalf("per-key for the secret given in the clear: %d %s", w.Code, w.Body)
	}
	w = f.do("GET", "/v1/state?rule=login&user=u42", "")
	if w.Code != 400 || !strings.Contains(w.Body.String(), "ip") {
		t.Fatalf("a missing source: %d %s", w.Code, w.Body)
	}
	if w := f.do("GET", "/v1/state?rule=login&user=u42&ip=nowhere", ""); w.Code != 400 {
		t.Fatalf("a bad address: %d %s", w.Code, w.Body)
	}
	if w := f.do("DELETE", "/v1/state?rule=login&user=u42&ip=2001:db8::1", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"reset":true`) {
		t.Fatalf("reset by source values: %d %s", w.Code, w.Body)
	}
}

func TestMetricsHealthAndReadiness(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	f.do("POST", "/v1/check", `{"attributes":{"phone":"8801700000000"}}`)
	f.do("POST", "/v1/check", `{"attributes":{"phone":"8801700000000"}}`)
	w := f.do("GET", "/metrics", "")
	body := w.Body.String()
	for _, want := range []string{
		`sluice_decisions_total{outcome="allowed",rule="otp"} 1`,
		`sluice_decisions_total{outcome="limited",rule="otp"} 1`,
		`sluice_decisions_total{outcome="skipped",rule="otp"} 0`, // a rule that decided has all its outcomes
		`sluice_store_breaker_state 0`,
		`sluice_config_reloads_total{result="ok"} 0`,
		`sluice_memory_store_keys{rule="otp"} 1`,
		`sluice_build_info{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, "8801700000000") || strings.Contains(body, "phone") {
		t.Error("a key appears in the metrics")
	}
	if strings.Contains(body, `rule="login"`) {
		t.Error("a rule that has decided nothing has series: with 50,000 such rules a scrape is 28 MB")
	}
	if w := f.do("GET", "/healthz", ""); w.Code != 200 {
		t.Fatalf("healthz %d", w.Code)
	}
	if w := f.do("GET", "/readyz", ""); w.Code != 200 {
		t.Fatalf("readyz %d", w.Code)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:80": true, "localhost:1": true, ":8080": false, "0.0.0.0:80": false, "10.0.0.1:80": false} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v", addr, got)
		}
	}
}

func TestChargeReportsAResponseForCountOnRules(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	// Replace the rules with a countOn login rule.
	cfg, _ := rules.Parse("c.yaml", []byte("rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 2, per: 15m, countOn: {status: [401]}}\n"))
	f.srv.e.Reload(cfg)
	req := `{"request":{"method":"POST","path":"/login"},"attributes":{"user":"u42"}`
	for range 2 {
		var resp CheckResponse
		json.Unmarshal(f.do("POST", "/v1/check", req+`}`).Body.Bytes(), &resp)
		if !resp.Allowed {
			t.Fatalf("check before the response: %+v", resp)
		}
		w := f.do("POST", "/v1/charge", req+`,"status":401}`)
		if w.Code != 200 || !strings.Contains(w.Body.String(), `"rule":"login"`) {
			t.Fatalf("charge: %d %s", w.Code, w.Body)
		}
	}
	var resp CheckResponse
	json.Unmarshal(f.do("POST", "/v1/check", req+`}`).Body.Bytes(), &resp)
	if resp.Allowed {
		t.Fatal("two charged failures did not exhaust the rule")
	}
	if w := f.do("POST", "/v1/charge", req+`}`); w.Code != 400 {
		t.Fatalf("charge without a status: %d", w.Code)
	}
	if w := f.do("POST", "/v1/check", req+`,"status":401}`); w.Code != 400 {
		t.Fatalf("check with a status: %d", w.Code)
	}
}

// A bad body's problem speaks JSON, not Go: no Go type names, and no HTML
// escapes in the detail.
func TestBadBodiesAreExplainedInJSONTerms(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	for body, want := range map[string]string{
		`{"cost":"x"}`:              "want an integer in range, got a JSON string",
		`{"cost":1e40}`:             "want an integer in range, got a JSON number 1e40",
		`{"request":[1]}`:           "want an object, got a JSON array",
		`{"dryRun":"yes"}`:          "want true or false, got a JSON string",
		`{"attributes":{"user":5}}`: "want a string, got a JSON number",
		`<x>`:                       "invalid character '<'",
	} {
		w := f.do("POST", "/v1/check", body)
		var p struct{ Detail string }
		json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != 400 || !strings.Contains(p.Detail, want) {
			t.Errorf("%s: %d %q, want %q", body, w.Code, p.Detail, want)
		}
		for _, goism := range []string{"int64", "server.", "struct", `\u003c`, "json: "} {
			if strings.Contains(w.Body.String(), goism) {
				t.Errorf("%s: the answer shows %q: %s", body, goism, w.Body)
			}
		}
	}
}

// The gateway's /readyz includes its upstream: not ready while the service
// it protects cannot be reached.
func TestReadinessIncludesTheUpstream(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	live, _ := url.Parse(up.URL)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead, _ := url.Parse("http://" + ln.Addr().String())
	ln.Close() // nothing listens there now
	for _, tc := range []struct {
		u    *url.URL
		code int
		want string
	}{{live, 200, "reachable"}, {dead, 503, "cannot be reached"}} {
		f := newFixture(t, Options{Loopback: true, Upstream: gateway.UpstreamCheck(tc.u)})
		if w := f.do("GET", "/readyz", ""); w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("upstream %s: %d %s", tc.u, w.Code, w.Body)
		}
	}
}

// Forward-auth takes the original method and URI only from the headers its
// proxy sets: a client's own copy of another proxy's headers (which its
// proxy passes through untouched) names nothing. Each proxy type is asked
// for POST /only-this by its own headers while the client names GET /other
// in every other proxy's; a rule of 1 on POST /only-this must refuse the
// second call.
func TestForwardAuthReadsOnlyItsProxysMethodAndURI(t *testing.T) {
	src := "trustedProxies: [192.0.2.0/24]\nrules:\n  - {id: one, match: {method: POST, path: /only-this}, key: [ip], rate: 1, per: 1h}\n"
	own := map[AuthProxy][]string{
		AuthNginx:   {"X-Original-Method", "POST", "X-Original-URI", "/only-this", "X-Real-IP", "203.0.113.7"},
		AuthTraefik: {"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/only-this", "X-Forwarded-For", "203.0.113.7"},
		AuthCaddy:   {"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/only-this", "X-Forwarded-For", "203.0.113.7"},
		AuthEnvoy:   {"X-Forwarded-For", "203.0.113.7"},
	}
	spoofs := map[AuthProxy][]string{ // every other proxy's headers, naming GET /other
		AuthNginx:   {"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/other"},
		AuthTraefik: {"X-Original-Method", "GET", "X-Original-URI", "/other"},
		AuthCaddy:   {"X-Original-Method", "GET", "X-Original-URI", "/other"},
		AuthEnvoy:   {"X-Original-Method", "GET", "X-Original-URI", "/other", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/other"},
	}
	for proxy, hdr := range own {
		f := newFixtureOf(t, src, Options{Loopback: true, AuthProxy: proxy})
		var codes []int
		for range 2 {
			target := "/v1/auth"
			if proxy == AuthEnvoy {
				target = "/v1/auth/only-this" // Envoy sends the original path after its prefix
			}
			r := httptest.NewRequest("POST", target, nil)
			r.RemoteAddr = "192.0.2.10:4000"
			for i := 0; i+1 < len(hdr); i += 2 {
				r.Header.Set(hdr[i], hdr[i+1])
			}
			for i := 0; i+1 < len(spoofs[proxy]); i += 2 {
				r.Header.Set(spoofs[proxy][i], spoofs[proxy][i+1])
			}
			w := httptest.NewRecorder()
			f.srv.ServeHTTP(w, r)
			codes = append(codes, w.Code)
		}
		if codes[0] != 200 || codes[1] != 429 {
			t.Errorf("%s: %v, want [200 429]: the client's own headers moved the request off POST /only-this", proxy, codes)
		}
	}
}

// Header and attribute names are case-insensitive in the JSON API: any
// spelling of a name counts under the one key, and two spellings of one
// name in a request are refused (400) rather than one chosen by map order.
// A property over random spellings: the first three checks of a user on a
// rule of 2 per 15 minutes admit two, whatever the spellings.
func TestCheckAPINamesAreCaseInsensitive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	spell := func(name string) string {
		b := []byte(name)
		for i := range b {
			if rng.IntN(2) == 0 {
				b[i] = byte(unicode.ToUpper(rune(b[i])))
			} else {
				b[i] = byte(unicode.ToLower(rune(b[i])))
			}
		}
		return string(b)
	}
	for round := range 50 {
		f := newFixture(t, Options{Loopback: true})
		user := fmt.Sprintf("u%d", round)
		var codes []int
		for range 3 {
			var body string
			if rng.IntN(2) == 0 {
				body = fmt.Sprintf(`{"request":{"method":"POST","path":"/login","ip":"198.51.100.1","headers":{%q:%q}}}`, spell("X-User-ID"), user)
			} else {
				body = fmt.Sprintf(`{"request":{"method":"POST","path":"/login","ip":"198.51.100.1"},"attributes":{%q:%q}}`, spell("user"), user)
			}
			w := f.do("POST", "/v1/check", body)
			var a CheckResponse
			json.Unmarshal(w.Body.Bytes(), &a)
			codes = append(codes, w.Code)
			if w.Code == 200 && a.Allowed {
				codes[len(codes)-1] = 1
			}
		}
		if codes[0] != 1 || codes[1] != 1 || codes[2] != 200 {
			t.Fatalf("round %d: %v, want two admitted and one refused under one key", round, codes)
		}
	}
	f := newFixture(t, Options{Loopback: true})
	for _, body := range []string{
		`{"request":{"path":"/login","headers":{"x-user-id":"victim","X-User-Id":"attacker"}}}`,
		`{"attributes":{"user":"victim","User":"attacker"}}`,
	} {
		if w := f.do("POST", "/v1/check", body); w.Code != 400 || !strings.Contains(w.Body.String(), "case-insensitive") {
			t.Errorf("%s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
	// The same name twice, which Go's decoder reads as the last: refused
	// too, as is the object given twice under two spellings.
	for _, body := range []string{
		`{"request":{"path":"/login","headers":{"X-User-Id":"attacker","X-User-Id":"victim"}}}`,
		`{"attributes":{"user":"attacker","user":"victim"}}`,
	} {
		if w := f.do("POST", "/v1/check", body); w.Code != 400 || !strings.Contains(w.Body.String(), "given twice") {
			t.Errorf("%s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
	for _, body := range []string{
		`{"attributes":{"user":"attacker"},"Attributes":{"user":"victim"}}`,
		`{"request":{"headers":{"X-User-Id":"a"},"Headers":{"X-User-Id":"b"}}}`,
	} {
		if w := f.do("POST", "/v1/check", body); w.Code != 400 || !strings.Contains(w.Body.String(), "case-sensitive") {
			t.Errorf("%s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
	if w := f.do("POST", "/v1/check", `{"attributes":{"user":7}}`); w.Code != 400 {
		t.Errorf("a number for an attribute: %d %s", w.Code, w.Body)
	}
	if w := f.do("POST", "/v1/check", `{"attributes":null,"request":{"headers":{"X-User-Id":"u"}}}`); w.Code != 200 {
		t.Errorf("null attributes: %d %s", w.Code, w.Body)
	}
}

// DNS rebinding: a web page the operator opens can send requests to a
// loopback listener, under the page's own name resolved to 127.0.0.1, or to
// 127.0.0.1 from another origin. Without a token the admin endpoints answer
// only requests addressed to the listener (its Host) and take changes only
// from no origin or an allowed one; a token opens them to any Host.
func TestAdminEndpointsRefuseOtherHostsAndOrigins(t *testing.T) {
	f := newFixture(t, Options{Loopback: true, AdminHosts: []string{"sluice.internal"}})
	for _, c := range []struct {
		method, target string
		hdr            []string
		want           int
	}{
		{"GET", "/v1/rules", []string{"Host", "127.0.0.1:8080"}, 200},
		{"GET", "/v1/rules", []string{"Host", "localhost:8080"}, 200},
		{"GET", "/v1/rules", []string{"Host", "[::1]:8080"}, 200},
		{"GET", "/v1/rules", []string{"Host", "sluice.internal:9091"}, 200},
		{"GET", "/v1/rules", []string{"Host", "attacker.example:8080"}, 403},
		{"GET", "/ui", []string{"Host", "attacker.example:8080"}, 403},
		{"GET", "/metrics", []string{"Host", "attacker.example:8080"}, 403},
		{"GET", "/metrics", []string{"Host", "127.0.0.1:8080"}, 200},
		{"GET", "/metrics", []string{"Host", "sluice.internal"}, 200},
		{"GET", "/v1/ui/state", []string{"Host", "attacker.example"}, 403},
		{"DELETE", "/v1/state?rule=otp&key=555", []string{"Host", "attacker.example:8080"}, 403},
		{"DELETE", "/v1/state?rule=otp&key=555", []string{"Origin", "https://attacker.example"}, 403},
		{"DELETE", "/v1/state?rule=otp&key=555", []string{"Origin", "null"}, 403},
		{"PUT", "/v1/pressure", []string{"Origin", "http://evil.localhost.example"}, 403},
		{"DELETE", "/v1/state?rule=otp&key=555", []string{"Origin", "http://127.0.0.1:8080"}, 200},
		{"DELETE", "/v1/state?rule=otp&key=555", nil, 200},                        // curl sends no Origin
		{"GET", "/v1/rules", []string{"Origin", "https://attacker.example"}, 200}, // reads need CORS, which is not offered
	} {
		if w := f.do(c.method, c.target, "", c.hdr...); w.Code != c.want {
			t.Errorf("%s %s %v: %d, want %d (%s)", c.method, c.target, c.hdr, w.Code, c.want, w.Body)
		}
	}
	tok := newFixture(t, Options{Loopback: true, AdminToken: "t0k"})
	if w := tok.do("DELETE", "/v1/state?rule=otp&key=555", "", "Host", "sluice.example.net", "Authorization", "Bearer t0k"); w.Code != 200 {
		t.Errorf("with the token, any Host: %d", w.Code)
	}
	if w := tok.do("GET", "/metrics", "", "Host", "sluice.example.net"); w.Code != 200 {
		t.Errorf("/metrics with an admin token set, any Host (Prometheus scrapes without it): %d", w.Code)
	}
}

// The JSON API answers what the gateway would: a refusal by an adaptive
// rule the service's pressure reduced is reduced-capacity and 503, a spent
// quota limited and 429, an admitted request 200.
func TestCheckAnswersTheGatewaysStatus(t *testing.T) {
	cfg, err := rules.Parse("a.yaml", []byte("rules:\n  - {id: search, key: [user], rate: 4, per: 1h, adaptive: true}\n  - {id: plain, key: [user], rate: 1, per: 1h, match: {path: /plain}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Pressure: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Engine: e, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	check := func(user, path string) CheckResponse {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"request":{"path":"`+path+`"},"attributes":{"user":"`+user+`"}}`)))
		var out CheckResponse
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		return out
	}
	var got []string
	for range 3 { // 4 an hour at half: 2 pass
		r := check("u1", "/search")
		got = append(got, fmt.Sprint(r.Status, " ", r.Reason))
	}
	if strings.Join(got, ", ") != "200 ok, 200 ok, 503 reduced-capacity" {
		t.Fatalf("adaptive at half its rate: %v", got)
	}
	check("u2", "/plain")
	if r := check("u2", "/plain"); r.Status != 429 || r.Reason != "limited" || r.Rule != "plain" {
		t.Fatalf("a spent quota: %d %s %s", r.Status, r.Reason, r.Rule)
	}
}

// A key charged beyond its limit shows its debt in /v1/state: nothing
// passes until it is paid off, and remaining 0 alone would not say so.
func TestStateShowsADebt(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	cfg, err := rules.Parse("r.yaml", []byte("rules:\n  - {id: tokens, key: [user], rate: 100, per: 1m, reserve: {estimate: 10, actualHeader: X-Used}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f.srv.e.Reload(cfg)
	state := func() StateJSON {
		var st StateJSON
		w := f.do("GET", "/v1/state?rule=tokens&user=u42", "")
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != 200 {
			t.Fatalf("/v1/state: %d %s", w.Code, w.Body)
		}
		return st
	}
	settle := func(actual int) {
		var r CheckResponse
		json.Unmarshal(f.do("POST", "/v1/reserve", `{"attributes":{"user":"u42"}}`).Body.Bytes(), &r)
		if r.ID == "" {
			t.Fatalf("no reservation: %+v", r)
		}
		if w := f.do("POST", "/v1/settle", fmt.Sprintf(`{"id":%q,"actual":%d}`, r.ID, actual)); w.Code != 200 {
			t.Fatalf("settle: %d %s", w.Code, w.Body)
		}
	}
	if st := state(); st.InDebt || st.Remaining != 100 {
		t.Fatalf("untouched: %+v", st)
	}
	settle(150) // reserved 10, used 150: 50 beyond the limit
	st := state()
	if !st.InDebt || st.Remaining != 0 {
		t.Fatalf("charged 150 against 100: %+v, want in debt", st)
	}
	// 50 units over at one back every 0.6 s: paid off in 30 s.
	if st.DebtPaidInMs != 30000 {
		t.Fatalf("debt paid in %d ms, want 30000", st.DebtPaidInMs)
	}
	f.clock.Advance(30 * time.Second)
	if st := state(); st.InDebt || st.Remaining != 0 {
		t.Fatalf("paid off: %+v, want out of debt with nothing left yet", st)
	}
}

// /readyz's first line is the verdict: "not ready" and why, never "ready"
// followed by a reason it is not.
func TestReadyzSaysItsVerdictFirst(t *testing.T) {
	down := newFixture(t, Options{Loopback: true, Upstream: func(context.Context) (string, error) {
		return "127.0.0.1:9", errors.New("connection refused")
	}})
	w := down.do("GET", "/readyz", "")
	if w.Code != 503 || !strings.HasPrefix(w.Body.String(), "not ready: the upstream 127.0.0.1:9 cannot be reached") || strings.Contains(w.Body.String(), "\nready") {
		t.Fatalf("upstream down: %d %q", w.Code, w.Body)
	}
	up := newFixture(t, Options{Loopback: true})
	if w := up.do("GET", "/readyz", ""); w.Code != 200 || !strings.HasPrefix(w.Body.String(), "ready\n") {
		t.Fatalf("ready: %d %q", w.Code, w.Body)
	}
}

// GET / names what the listener serves; any other unknown path is a 404.
func TestTheRootNamesTheEndpoints(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	if w := f.do("GET", "/", ""); w.Code != 200 || !strings.Contains(w.Body.String(), "/v1/check") || !strings.Contains(w.Body.String(), "/ui") {
		t.Fatalf("GET /: %d %q", w.Code, w.Body)
	}
	if w := f.do("GET", "/nowhere", ""); w.Code != 404 {
		t.Fatalf("GET /nowhere: %d", w.Code)
	}
}

// remoteStore hides the embedded store's NonBlocking: the engine guards it
// as it would Redis (deadline, breakers, late replies).
type remoteStore struct{ sluice.Store }

// With a remote store every guarded series is served, each once, and the
// exposition passes the Prometheus linter: a series collected twice makes
// the whole page an error, and a scrape then sees nothing.
func TestMetricsOfAGuardedStoreAreServed(t *testing.T) {
	cfg, err := rules.Parse("test.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := metrics.New("test")
	e, err := engine.New(cfg, engine.Options{Store: remoteStore{memory.New()}, Logger: quiet, Calls: storecall.Options{OnCall: m.ObserveStoreCall}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Engine: e, Logger: quiet, Metrics: m, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{srv: s}
	f.do("POST", "/v1/check", `{"attributes":{"phone":"8801700000000"}}`)
	w := f.do("GET", "/metrics", "")
	if w.Code != 200 {
		t.Fatalf("/metrics: %d %s", w.Code, w.Body)
	}
	for _, want := range []string{
		`sluice_store_late_replies_total{outcome="answered"} 0`,
		`sluice_store_late_replies_total{outcome="lost"} 0`,
		`sluice_store_late_replies_total{outcome="unsent"} 0`,
		`sluice_degraded_credit_units 0`,
		`sluice_degraded_refunded_units_total 0`,
		`sluice_store_deadline_seconds`,
	} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// A gateway of a region describes a rule with regions by the share it
// enforces, on /v1/rules and the live page alike.
func TestRuleDescriptionsNameThisGatewaysRegionalShare(t *testing.T) {
	f := newFixtureOf(t, "rules:\n  - {id: search, key: [user], rate: 300, per: 1m, regions: {eu: 50%, us: 50%}}\n", Options{Loopback: true, Region: "eu", Live: NewLive()})
	const want = "regions eu 50%, us 50%: this gateway (eu) enforces at most 150 at once, then 150 per minute"
	if w := f.do("GET", "/v1/rules", ""); !strings.Contains(w.Body.String(), want) {
		t.Errorf("/v1/rules: %s, want %q", w.Body, want)
	}
	f.srv.o.Live.Attach(f.srv.e)
	if w := f.do("GET", "/v1/ui/state", ""); !strings.Contains(w.Body.String(), want) {
		t.Errorf("/v1/ui/state: %d %s, want %q", w.Code, w.Body, want)
	}
}

// /v1/check tells the caller the status to answer: a rule's own refusal
// status (status: 503, as nginx answers), 429 otherwise.
func TestCheckSaysTheRulesRefusalStatus(t *testing.T) {
	f := newFixtureOf(t, "rules:\n  - {id: nginx-like, key: [ip], rate: 1, per: 1h, status: 503}\n", Options{Loopback: true})
	body := `{"request":{"ip":"203.0.113.9"}}`
	for i, want := range []int{200, 503} {
		w := f.do("POST", "/v1/check", body)
		var resp CheckResponse
		if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || resp.Status != want {
			t.Fatalf("check %d: %v %s, want status %d", i+1, err, w.Body, want)
		}
	}
}

package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

const settleRules = `
rules:
  - id: tokens
    match: {path: /v1/completions}
    key: [header:X-API-Key]
    rate: 10000
    per: 1m
    reserve: {estimate: 1000, estimateHeader: X-Max-Tokens, actualJSON: usage.total_tokens}
  - id: bytes
    match: {path: /v1/files}
    key: [header:X-API-Key]
    rate: 1000000
    per: 1m
    reserve: {estimate: 50000, actualHeader: X-Bytes-Used}
  - id: failed-logins
    match: {path: /login}
    key: [ip]
    rate: 2
    per: 1h
    countOn: {status: [401]}
`

// Both data planes settle each reservation from the upstream's answer: a
// JSON field or a header, the real cost whichever side of the estimate it
// falls; an answer that does not say leaves the estimate. And both charge
// countOn rules for the status the upstream gave.
func TestGatewaysSettleFromTheUpstreamsAnswer(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used := r.URL.Query().Get("used")
		switch r.URL.Path {
		case "/v1/completions":
			w.Header().Set("Content-Type", "application/json")
			if used == "" {
				fmt.Fprint(w, `{"choices":[]}`)
				return
			}
			fmt.Fprintf(w, `{"id":"c1","usage":{"prompt_tokens":1,"total_tokens":%s}}`, used)
		case "/v1/files":
			w.Header().Set("X-Bytes-Used", used)
			w.Write([]byte("stored"))
		case "/login":
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer up.Close()
	for _, p := range testPlanes {
		if !p.gateway {
			continue // forward-auth never sees the answer (the plane suite's countOn case)
		}
		t.Run(p.name, func(t *testing.T) {
			base, e := p.start(t, up.URL, settleRules, Options{})
			get := func(path, maxTokens string) int {
				t.Helper()
				req, _ := http.NewRequest("POST", base+path, nil)
				req.Header.Set("X-API-Key", "k1")
				if maxTokens != "" {
					req.Header.Set("X-Max-Tokens", maxTokens)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			left := func(rule, key string) int64 {
				t.Helper()
				d, _, err := e.Inspect(context.Background(), rule, key)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			want := int64(10000)
			for _, c := range []struct {
				maxTokens, used string
				cost            int64
			}{
				{"", "300", 300},      // the rule's estimate (1000) was high
				{"200", "1700", 1700}, // the request's estimate was low
				{"500", "", 500},      // the answer does not say: the estimate stands
				{"", "0", 0},          // nothing used: all given back
			} {
				if code := get("/v1/completions?used="+c.used, c.maxTokens); code != 200 {
					t.Fatalf("status %d", code)
				}
				want -= c.cost
				if got := left("tokens", "k1"); got != want {
					t.Fatalf("estimate %q, used %q: %d tokens left, want %d", c.maxTokens, c.used, got, want)
				}
			}
			get("/v1/files?used=123456", "")
			if got := left("bytes", "k1"); got != 1000000-123456 {
				t.Fatalf("settled from a header: %d left", got)
			}
			for range 3 {
				get("/login", "")
			}
			if got := left("failed-logins", "127.0.0.1"); got != 0 {
				t.Fatalf("three 401s through the %s gateway: %d failed logins left, want 0", p.name, got)
			}
			if code := get("/login", ""); code != 429 {
				t.Fatalf("a fourth login: %d, want 429", code)
			}
			st := e.Stats()
			if st[0].Settled != 4 || st[1].Settled != 1 {
				t.Errorf("settle counts %d, %d: want 4, 1", st[0].Settled, st[1].Settled)
			}
		})
	}
}

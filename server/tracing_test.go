package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/tracecheck"
	"github.com/sluice-rl/sluice/tracing"
)

// The JSON API and forward-auth make one span per decision, the child of
// the caller's traceparent, with the rule and the outcome (the gateway's
// planes and Envoy's call are held to the same in their packages). The
// second call of each is refused (1 an hour).
func TestEveryAPITracesItsDecisions(t *testing.T) {
	for _, c := range []struct{ name, via, path string }{
		{"json", "http", "/v1/check"},
		{"forward-auth", "auth", "/v1/auth"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tracecheck.TwoDecisions(t, c.via, "per-ip", false, func(t *testing.T, tr *tracing.Tracer) {
				f := newFixtureOf(t, tracecheck.Rules, Options{Loopback: true, Tracer: tr, AuthProxy: AuthNginx})
				s := httptest.NewServer(f.srv)
				defer s.Close()
				for range 2 {
					req, _ := http.NewRequest("GET", s.URL+c.path, nil)
					if c.path == "/v1/check" {
						req, _ = http.NewRequest("POST", s.URL+c.path, strings.NewReader(`{"request":{"ip":"203.0.113.9"}}`))
					}
					req.Header.Set("Traceparent", tracecheck.TraceParent)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
			})
		})
	}
}

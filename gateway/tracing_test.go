package gateway

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/internal/testkit/tracecheck"
	"github.com/sluice-rl/sluice/tracing"
)

// Both planes make one span per decision, the child of the caller's
// traceparent, with the rule and the outcome. The second request is
// refused (1 an hour).
func TestBothPlanesTraceTheirDecisions(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	for _, plane := range Planes {
		t.Run(plane, func(t *testing.T) {
			tracecheck.TwoDecisions(t, "gateway", "per-ip", false, func(t *testing.T, tr *tracing.Tracer) {
				p, err := New(plane, u, planeEngine(t, tracecheck.Rules), Options{Logger: quietLog, HTTP: httplimit.Options{Tracer: tr.Pipeline()}})
				if err != nil {
					t.Fatal(err)
				}
				base := serve(t, p)
				for range 2 {
					req, _ := http.NewRequest("GET", base+"/x", nil)
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

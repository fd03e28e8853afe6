package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/tracing"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceParent = "00-" + traceID + "-00f067aa0ba902b7-01"
	tracedRules = "trustedProxies: [127.0.0.1/32]\nrules:\n  - id: per-ip\n    key: [ip]\n    rate: 1\n    per: 1h\n"
)

// Every API that decides makes one span per decision, the child of the
// caller's traceparent, with the rule and the outcome: the JSON API,
// forward-auth, Envoy's call on both gRPC servers, and both gateway planes.
// The second call of each is refused (1 an hour).
func TestEveryAPITracesItsDecisions(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	httpCall := func(t *testing.T, base, path string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if path == "/v1/check" {
			req, _ = http.NewRequest("POST", base+path, strings.NewReader(`{"request":{"ip":"203.0.113.9"}}`))
		}
		req.Header.Set("Traceparent", traceParent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	cases := []struct {
		name, via, rule string
		run             func(t *testing.T, tr *tracing.Tracer)
		noRefusal       bool // 100 a year: both calls pass
	}{
		{"json", "http", "per-ip", func(t *testing.T, tr *tracing.Tracer) {
			srv, err := New(Options{Engine: planeEngine(t, tracedRules), Loopback: true, Logger: quietLog, Tracer: tr})
			if err != nil {
				t.Fatal(err)
			}
			s := httptest.NewServer(srv)
			defer s.Close()
			for range 2 {
				httpCall(t, s.URL, "/v1/check")
			}
		}, false},
		{"forward-auth", "auth", "per-ip", func(t *testing.T, tr *tracing.Tracer) {
			srv, err := New(Options{Engine: planeEngine(t, tracedRules), Loopback: true, Logger: quietLog, Tracer: tr, AuthProxy: AuthNginx})
			if err != nil {
				t.Fatal(err)
			}
			s := httptest.NewServer(srv)
			defer s.Close()
			for range 2 {
				httpCall(t, s.URL, "/v1/auth")
			}
		}, false},
		{"gateway-fasthttp", "gateway", "per-ip", func(t *testing.T, tr *tracing.Tracer) {
			base, _ := startFastPlane(t, upstream.URL, tracedRules, GatewayOptions{HTTP: httplimit.Options{Tracer: tr.Pipeline()}})
			for range 2 {
				httpCall(t, base, "/x")
			}
		}, false},
		{"gateway-net-http", "gateway", "per-ip", func(t *testing.T, tr *tracing.Tracer) {
			s := httptest.NewServer(Gateway(u, planeEngine(t, tracedRules), GatewayOptions{Logger: quietLog, HTTP: httplimit.Options{Tracer: tr.Pipeline()}}))
			defer s.Close()
			for range 2 {
				httpCall(t, s.URL, "/x")
			}
		}, false},
	}
	for _, kind := range []string{"sluice", "grpc-go"} {
		cases = append(cases, struct {
			name, via, rule string
			run             func(t *testing.T, tr *tracing.Tracer)
			noRefusal       bool
		}{"envoy-" + kind, "envoy", "load.once", func(t *testing.T, tr *tracing.Tracer) {
			f := startTracedGRPC(t, kind, tr)
			c := rlsv3.NewRateLimitServiceClient(grpcClient(t, f.addr))
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceParent)
			for range 2 {
				if _, err := c.ShouldRateLimit(ctx, loadRequest("once", "u1")); err != nil {
					t.Fatal(err)
				}
			}
		}, true})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			c.run(t, tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
			spans := rec.Ended()
			if len(spans) != 2 {
				t.Fatalf("%d spans for 2 decisions", len(spans))
			}
			for i, s := range spans {
				a := map[string]string{}
				for _, kv := range s.Attributes() {
					a[string(kv.Key)] = kv.Value.Emit()
				}
				if s.Parent().TraceID().String() != traceID || s.Name() != tracing.SpanName {
					t.Fatalf("span %d: %q, parent %v", i, s.Name(), s.Parent())
				}
				wantAllowed := "true"
				if i == 1 && !c.noRefusal {
					wantAllowed = "false"
				}
				if a["sluice.via"] != c.via || a["sluice.rule"] != c.rule || a["sluice.allowed"] != wantAllowed {
					t.Fatalf("span %d attributes %v: want via %s, rule %s, allowed %s", i, a, c.via, c.rule, wantAllowed)
				}
			}
		})
	}
}

// startTracedGRPC is startGRPC with a tracer.
func startTracedGRPC(t *testing.T, kind string, tr *tracing.Tracer) *grpcFixture {
	t.Helper()
	f := startGRPC(t, kind, GRPCOptions{})
	srv, err := New(Options{Engine: f.e, Loopback: true, Logger: quietLog, Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	g, err := srv.NewGRPC(kind, GRPCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ln := loopbackListener(t)
	go g.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g.Shutdown(ctx)
	})
	return &grpcFixture{kind: kind, addr: ln.Addr().String(), g: g, e: f.e}
}

package envoy

import (
	"context"
	"net"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/internal/testkit/tracecheck"
	"github.com/sluice-rl/sluice/tracing"
	"google.golang.org/grpc/metadata"
)

// Envoy's call makes one span per decision on both gRPC servers, the child
// of the caller's traceparent, with the rule and the outcome (100 a year:
// both calls pass).
func TestBothServersTraceTheirDecisions(t *testing.T) {
	for _, kind := range GRPCServerKinds {
		t.Run(kind, func(t *testing.T) {
			tracecheck.TwoDecisions(t, "envoy", "load.once", true, func(t *testing.T, tr *tracing.Tracer) {
				s, err := New(Options{Engine: contractEngine(t), Logger: quietLog, Tracer: tr})
				if err != nil {
					t.Fatal(err)
				}
				g, err := s.NewGRPC(kind, GRPCOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				go g.Serve(ln)
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					g.Shutdown(ctx)
				})
				c := rlsv3.NewRateLimitServiceClient(grpcClient(t, ln.Addr().String()))
				ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", tracecheck.TraceParent)
				for range 2 {
					if _, err := c.ShouldRateLimit(ctx, loadRequest("once", "u1")); err != nil {
						t.Fatal(err)
					}
				}
			})
		})
	}
}

package envoy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/testkit/benchtest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkEnvoyGRPC measures ShouldRateLimit with one descriptor from a
// grpc-go client over one loopback connection, calls in parallel, on
// sluice's own gRPC server and on grpc-go's: decisions per second and p99.
func BenchmarkEnvoyGRPC(b *testing.B) {
	cfg, _ := rules.Parse("e.yaml", []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet})
	s, _ := New(Options{Engine: e, Logger: quiet})
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
	}}}
	for _, server := range []string{"sluice", "grpc-go"} {
		b.Run("server="+server, func(b *testing.B) {
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			g, err := s.NewGRPC(server, GRPCOptions{})
			if err != nil {
				b.Fatal(err)
			}
			go g.Serve(ln)
			defer g.Shutdown(context.Background())
			conn, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			benchtest.Parallel(b, func() error {
				_, err := client.ShouldRateLimit(context.Background(), req)
				return err
			})
		})
	}
}

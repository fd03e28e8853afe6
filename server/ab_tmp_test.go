package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func BenchmarkAB(b *testing.B) {
	for _, tc := range []struct{ name string; mk func(s *Server) *grpc.Server }{
		{"plain", func(s *Server) *grpc.Server { return grpc.NewServer(grpc.UnaryInterceptor(s.UnaryRecover())) }},
		{"tuned", func(s *Server) *grpc.Server { return s.NewGRPCServer() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, _ := rules.Parse("e.yaml", []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"))
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet})
			s, _ := New(Options{Engine: e, Loopback: true, Logger: quiet})
			g := tc.mk(s)
			s.RegisterEnvoy(g)
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			go g.Serve(ln)
			defer g.Stop()
			conn, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
				Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
			}}}
			parallel(b, func() error {
				_, err := client.ShouldRateLimit(context.Background(), req)
				return err
			})
		})
	}
}

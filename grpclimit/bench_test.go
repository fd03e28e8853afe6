package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/grpclimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// BenchmarkUnaryInterceptor is BenchmarkMiddleware's (httplimit) two rules,
// per user (metadata) and per address (the peer), for a unary call:
// admitted, and refused (with RetryInfo, QuotaFailure and the RateLimit
// metadata).
func BenchmarkUnaryInterceptor(b *testing.B) {
	for _, c := range []struct {
		name string
		rate string
	}{{"allowed", "1000000000"}, {"refused", "1"}} {
		b.Run(c.name, func(b *testing.B) {
			clock := sluice.NewManualClock(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC))
			cfg, err := rules.Parse("b.yaml", []byte("rules:\n  - {id: per-user, key: [user], rate: "+c.rate+", per: 1h}\n  - {id: per-ip, key: [ip], rate: 1000000000, per: 1s}\n"))
			if err != nil {
				b.Fatal(err)
			}
			e, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			intercept := grpclimit.New(e, grpclimit.Options{}).UnaryServerInterceptor()
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user-id", "u42"))
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 4242}})
			ctx = grpc.NewContextWithServerTransportStream(ctx, discardStream{})
			info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Service/Method"}
			handler := func(context.Context, any) (any, error) { return nil, nil }
			intercept(ctx, nil, info, handler) // the refused case's one admission
			for b.Loop() {
				clock.Advance(time.Microsecond)
				_, err = intercept(ctx, nil, info, handler)
			}
			if (err == nil) != (c.name == "allowed") {
				b.Fatalf("%s: %v", c.name, err)
			}
		})
	}
}

// discardStream takes the metadata an interceptor sets, as grpc-go's
// server transport stream would.
type discardStream struct{}

func (discardStream) Method() string                  { return "/pkg.Service/Method" }
func (discardStream) SetHeader(metadata.MD) error     { return nil }
func (discardStream) SendHeader(metadata.MD) error    { return nil }
func (discardStream) SetTrailer(md metadata.MD) error { return nil }

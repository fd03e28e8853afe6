package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/grpclimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// grpcXRate is go-grpc-middleware's Limiter over one x/time/rate limiter: the
// usual way to rate limit a Go gRPC service without sluice (one limit for
// every caller, no key, no RetryInfo).
type grpcXRate struct{ l *rate.Limiter }

var errLimited = errors.New("limited")

func (x grpcXRate) Limit(context.Context) error {
	if !x.l.Allow() {
		return errLimited
	}
	return nil
}

type discardStream struct{}

func (discardStream) Method() string               { return "/pkg.Service/Method" }
func (discardStream) SetHeader(metadata.MD) error  { return nil }
func (discardStream) SendHeader(metadata.MD) error { return nil }
func (discardStream) SetTrailer(metadata.MD) error { return nil }

// BenchmarkGRPCInterceptors calls each server interceptor in the process
// with a handler that does nothing, the call admitted: sluice per user
// (metadata) with the embedded store, and go-grpc-middleware's ratelimit
// over x/time/rate, one limit for all.
func BenchmarkGRPCInterceptors(b *testing.B) {
	cfg, err := rules.Parse("b.yaml", []byte("rules:\n  - {id: per-user, key: [user], rate: 1000000000, per: 1s}\n"))
	if err != nil {
		b.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-user-id", "u42"))
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 4242}})
	ctx = grpc.NewContextWithServerTransportStream(ctx, discardStream{})
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Service/Method"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, c := range []struct {
		name string
		i    grpc.UnaryServerInterceptor
	}{
		{"sluice", grpclimit.New(e, grpclimit.Options{}).UnaryServerInterceptor()},
		{"go-grpc-middleware+x-time-rate", ratelimit.UnaryServerInterceptor(grpcXRate{rate.NewLimiter(rate.Every(time.Nanosecond), 1<<30)})},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.i(ctx, nil, info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

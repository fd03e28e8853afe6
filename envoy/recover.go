package envoy

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/metrics"
)

// unaryRecover is the grpc-go server's panic boundary: a panicking method
// is answered codes.Internal, logged and counted, instead of crashing the
// process.
func unaryRecover(m *metrics.Metrics, log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				m.Panicked(log, metrics.GRPC, v, "method", info.FullMethod)
				resp, err = nil, status.Error(codes.Internal, "sluice could not answer this request")
			}
		}()
		return handler(ctx, req)
	}
}

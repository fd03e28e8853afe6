package envoy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/internal/h2grpc"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The gRPC servers. `sluice serve --grpc-listen` answers Envoy's rate limit
// call (ShouldRateLimit, one handler: Service.decide) and the standard
// health check (grpc.health.v1.Health/Check, which Kubernetes gRPC probes
// and Envoy's gRPC health checker call, and List) on one of two servers:
//
//   - "sluice" (the default): sluice's own HTTP/2 server, package
//     internal/h2grpc, unary calls only, about half grpc-go's CPU per call;
//     grpc.health.v1.Health/Watch, a stream, is answered Unimplemented
//     (grpc-go's client-side health check then counts the server healthy,
//     as gRFC A17 says);
//   - "grpc-go": google.golang.org/grpc, which also serves Watch.
//
// Both take the same GRPCOptions and are held to one contract
// (grpc_contract_test.go): bounded memory per connection under a client that
// never grants send window, idle and slow clients, a connection cap,
// keepalive enforcement, MaxConnectionAge with grace, a two-phase GOAWAY on
// shutdown, flow control under load, health. Where grpc-go cannot meet a
// case the suite says so, and docs/service.md lists it.

// GRPCServerKinds names the gRPC servers, the default first.
var GRPCServerKinds = []string{"sluice", "grpc-go"}

// GRPCOptions bound the connections of either gRPC server alike.
type GRPCOptions struct {
	// MaxConnections bounds the connections served at once (default
	// 1024); beyond it, new connections wait to be accepted.
	MaxConnections int
	// MaxConnectionIdle closes a connection without a call for this long
	// (default 5 minutes).
	MaxConnectionIdle time.Duration
	// MaxConnectionAge drains a connection this long after it opened, ±10%
	// (default 30 minutes), and MaxConnectionAgeGrace is what its calls
	// then have before it closes (default 30 s): a client with long-lived
	// connections, such as Envoy, then spreads over replicas started since.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// RequestTimeout ends a connection holding a call whose request is
	// incomplete for this long (default 10 s). grpc-go has no such bound:
	// on it a client may trickle a request for as long as it likes.
	RequestTimeout time.Duration
	// TLS, if set, serves TLS with ALPN h2.
	TLS *tls.Config
}

// The defaults of GRPCOptions, and the bounds both servers share.
const (
	DefaultGRPCMaxConnections = 1024
	DefaultGRPCIdle           = 5 * time.Minute
	DefaultGRPCMaxAge         = 30 * time.Minute
	DefaultGRPCMaxAgeGrace    = 30 * time.Second
	grpcMaxStreams            = 1024
	grpcMaxRecvMsgSize        = 1 << 20
	grpcKeepaliveTime         = 2 * time.Hour
	grpcKeepaliveTimeout      = 20 * time.Second
	grpcMinPingInterval       = 10 * time.Second
	grpcHandshakeTimeout      = 10 * time.Second
	healthMethod              = "/grpc.health.v1.Health/Check"
	healthListMethod          = "/grpc.health.v1.Health/List"
)

func (o *GRPCOptions) defaults() {
	if o.MaxConnections <= 0 {
		o.MaxConnections = DefaultGRPCMaxConnections
	}
	if o.MaxConnectionIdle == 0 {
		o.MaxConnectionIdle = DefaultGRPCIdle
	}
	if o.MaxConnectionAge == 0 {
		o.MaxConnectionAge = DefaultGRPCMaxAge
	}
	if o.MaxConnectionAgeGrace == 0 {
		o.MaxConnectionAgeGrace = DefaultGRPCMaxAgeGrace
	}
}

// GRPC is one of the gRPC servers, ready to Serve.
type GRPC struct {
	h2       *h2grpc.Server
	g        *grpc.Server
	health   *health.Server
	maxConns int
}

// NewGRPC returns the gRPC server of the given kind (GRPCServerKinds)
// serving Envoy's rate limit service and health checks.
func (s *Service) NewGRPC(kind string, o GRPCOptions) (*GRPC, error) {
	o.defaults()
	hs := health.NewServer()
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	x := &GRPC{health: hs, maxConns: o.MaxConnections}
	switch kind {
	case "sluice":
		x.h2 = s.newH2()
		x.h2.Methods[healthMethod] = unary(hs.Check)
		x.h2.Methods[healthListMethod] = unary(hs.List)
		x.h2.TLSConfig = o.TLS
		x.h2.MaxConnections = o.MaxConnections
		x.h2.MaxConnectionIdle = o.MaxConnectionIdle
		x.h2.MaxConnectionAge = o.MaxConnectionAge
		x.h2.MaxConnectionAgeGrace = o.MaxConnectionAgeGrace
		x.h2.MaxConcurrentStreams = grpcMaxStreams
		x.h2.MaxRecvMsgSize = grpcMaxRecvMsgSize
		x.h2.KeepaliveTime, x.h2.KeepaliveTimeout = grpcKeepaliveTime, grpcKeepaliveTimeout
		x.h2.MinPingInterval = grpcMinPingInterval
		x.h2.RequestTimeout = o.RequestTimeout
	case "grpc-go":
		opts := []grpc.ServerOption{
			grpc.MaxConcurrentStreams(grpcMaxStreams),
			grpc.MaxRecvMsgSize(grpcMaxRecvMsgSize),
			grpc.ConnectionTimeout(grpcHandshakeTimeout),
			grpc.KeepaliveParams(keepalive.ServerParameters{
				MaxConnectionIdle: o.MaxConnectionIdle, MaxConnectionAge: o.MaxConnectionAge,
				MaxConnectionAgeGrace: o.MaxConnectionAgeGrace, Time: grpcKeepaliveTime, Timeout: grpcKeepaliveTimeout,
			}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcMinPingInterval, PermitWithoutStream: true}),
		}
		if o.TLS != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
		}
		x.g = s.newGRPCGo(opts...)
		healthpb.RegisterHealthServer(x.g, hs)
	default:
		return nil, fmt.Errorf("unknown gRPC server %q: want sluice or grpc-go", kind)
	}
	return x, nil
}

// Serve serves on ln until Shutdown.
func (x *GRPC) Serve(ln net.Listener) error {
	if x.h2 != nil {
		return x.h2.Serve(ln)
	}
	return x.g.Serve(netutil.LimitListener(ln, x.maxConns))
}

// Shutdown answers health checks NOT_SERVING, drains every connection with
// a two-phase GOAWAY, waits for the calls taken, and closes; if ctx ends
// first it closes at once.
func (x *GRPC) Shutdown(ctx context.Context) error {
	x.health.Shutdown()
	if x.h2 != nil {
		return x.h2.Shutdown(ctx)
	}
	done := make(chan struct{})
	go func() { x.g.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		x.g.Stop()
		return ctx.Err()
	}
}

// unary serves a unary method of a grpc-go service (the health.Server
// grpc-go serves: Check and List) on the h2grpc server.
func unary[In, Out any, PIn interface {
	*In
	proto.Message
}, POut interface {
	*Out
	proto.Message
}](call func(context.Context, PIn) (POut, error)) h2grpc.Method {
	return func(ctx context.Context, in, out []byte) ([]byte, error) {
		req := PIn(new(In))
		if err := proto.Unmarshal(in, req); err != nil {
			return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		resp, err := call(ctx, req)
		if err != nil {
			return nil, err
		}
		return proto.MarshalOptions{}.MarshalAppend(out, resp)
	}
}

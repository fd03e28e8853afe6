package server

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/internal/h2grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// EnvoyMethod is the full gRPC path of Envoy's rate limit call.
const EnvoyMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// NewEnvoyServer returns sluice's own gRPC server for Envoy's rate limit
// service: the same ShouldRateLimit as RegisterEnvoy serves on grpc-go, on a
// transport that does only unary calls over HTTP/2 and so spends a fraction
// of grpc-go's CPU per call (package internal/h2grpc). A panic is answered
// INTERNAL, logged and counted, as UnaryRecover does for grpc-go.
func (s *Server) NewEnvoyServer() *h2grpc.Server {
	x := &envoyService{s: s}
	return &h2grpc.Server{
		Methods:     map[string]h2grpc.Method{EnvoyMethod: x.call},
		KeepHeaders: s.traceHeaders(),
		OnPanic: func(method string, v any) {
			s.metrics.panics.grpc.Add(1)
			s.log.Error("sluice: recovered from a panic while serving a gRPC call",
				"method", method, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		},
	}
}

var rlsRequests = sync.Pool{New: func() any { return new(rlsv3.RateLimitRequest) }}

// call is ShouldRateLimit on the wire: it decodes the request, decides, and
// appends the encoded answer to out.
func (x *envoyService) call(ctx context.Context, in, out []byte) ([]byte, error) {
	req := rlsRequests.Get().(*rlsv3.RateLimitRequest)
	defer rlsRequests.Put(req)
	if err := proto.Unmarshal(in, req); err != nil { // resets req first
		return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	sc := envoyScratch.Get().(*envoyState)
	defer envoyScratch.Put(sc)
	resp, err := x.decide(ctx, req, sc, &sc.answer) // encoded before sc goes back
	if err != nil {
		return nil, err
	}
	out, err = proto.MarshalOptions{}.MarshalAppend(out, resp)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpc: error marshalling response: %v", err)
	}
	return out, nil
}

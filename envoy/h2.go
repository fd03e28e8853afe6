package envoy

import (
	"context"
	"sync"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/internal/h2grpc"
	"github.com/sluice-rl/sluice/metrics"
	"github.com/sluice-rl/sluice/rlqs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Method is the full gRPC path of Envoy's rate limit call.
const Method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// newH2 returns sluice's own gRPC server for the service: the same
// ShouldRateLimit as grpc-go serves, on a transport that does only unary
// calls over HTTP/2 and so spends a fraction of grpc-go's CPU per call
// (package internal/h2grpc). A panic is answered INTERNAL, logged and
// counted, as unaryRecover does for grpc-go.
func (x *Service) newH2() *h2grpc.Server {
	return &h2grpc.Server{
		Methods:     map[string]h2grpc.Method{Method: x.call},
		Streams:     map[string]h2grpc.StreamMethod{rlqs.Method: x.quotaStream},
		KeepHeaders: x.o.Tracer.Fields(),
		OnPanic: func(method string, v any) {
			x.o.Metrics.Panicked(x.o.Logger, metrics.GRPC, v, "method", method)
		},
	}
}

var rlsRequests = sync.Pool{New: func() any { return new(rlsv3.RateLimitRequest) }}

// call is ShouldRateLimit on the wire: it decodes the request, decides, and
// appends the encoded answer to out.
func (x *Service) call(ctx context.Context, in, out []byte) ([]byte, error) {
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

// quotaStream is the Rate Limit Quota Service's stream on the h2grpc server:
// the same rlqs.Service.Serve grpc-go calls, its messages decoded and
// encoded here.
func (x *Service) quotaStream(ctx context.Context, st *h2grpc.Stream) error {
	recv := func() (*rlqsv3.RateLimitQuotaUsageReports, error) {
		b, err := st.Recv()
		if err != nil {
			return nil, err
		}
		m := new(rlqsv3.RateLimitQuotaUsageReports)
		if err := proto.Unmarshal(b, m); err != nil {
			return nil, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return m, nil
	}
	send := func(m *rlqsv3.RateLimitQuotaResponse) error {
		b, err := proto.Marshal(m)
		if err != nil {
			return status.Errorf(codes.Internal, "grpc: error marshalling response: %v", err)
		}
		return st.Send(b)
	}
	return x.quota.Serve(ctx, recv, send)
}

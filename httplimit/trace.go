package httplimit

import (
	"context"
	"net/http"

	"github.com/sluice-rl/sluice/engine"
)

// A Tracer makes a span of each decision the pipeline makes, parented to
// the trace context the request carries. Package tracing's OpenTelemetry
// tracer is one (tracing.Tracer.Pipeline). It is declared here, where it is
// used, so that the middleware a library user imports depends on neither
// OpenTelemetry nor, through it, gRPC.
type Tracer interface {
	StartDecision(ctx context.Context, via string, header HeaderCarrier) (context.Context, DecisionSpan)
}

// A DecisionSpan is one decision's span. End records what res decided, or
// err, why no decision was made, and ends it.
type DecisionSpan interface {
	End(res *engine.Result, err error)
}

// A HeaderCarrier gives a request's header fields to a trace propagator.
// Its methods are those of OpenTelemetry's propagation.TextMapCarrier, so
// a carrier is one and the other.
type HeaderCarrier interface {
	Get(key string) string
	Set(key, value string)
	Keys() []string
}

// headerCarrier is a HeaderCarrier over an http.Header.
type headerCarrier http.Header

func (h headerCarrier) Get(key string) string { return http.Header(h).Get(key) }
func (h headerCarrier) Set(key, value string) { http.Header(h).Set(key, value) }
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

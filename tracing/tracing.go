// Package tracing makes an OpenTelemetry span of each decision, on every
// API that asks for one (the JSON API, forward-auth, Envoy's gRPC call, the
// gateway), parented to the caller's W3C trace context (traceparent,
// tracestate), so that a trace through a proxy shows what the limiter
// decided and how long its store took.
//
// A nil *Tracer traces nothing and costs nothing: Start returns its context
// unchanged and a zero Span, End does nothing, and neither allocates (the
// decision path keeps its 0 allocations; BenchmarkOff). Tracing is off
// unless a Tracer is made, from a TracerProvider the program configures
// (sluice serve and gateway make one from the standard OTEL_* variables).
//
// Each span, named "sluice.decision" and of kind server, carries:
//
//	sluice.via                 the API: http, auth, gateway or envoy
//	sluice.allowed             whether the request was admitted
//	sluice.outcome             ok, limited, cost-exceeds-limit, locked, unavailable, missing-key, bad-request
//	sluice.rule                the deciding rule (when one applied)
//	sluice.remaining           what it has left
//	sluice.retry_after_ms      when refused, when to retry
//	sluice.rules               how many rules answered (enforced and shadow)
//	sluice.degraded            the store failed and the fail modes answered
//	sluice.store.duration_ms   the time waited for a remote store (absent on the embedded store)
//
// and, on Envoy's call, sluice.domain. Keys are never recorded: a key may
// be a secret, such as an API key.
package tracing

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
)

// SpanName is the name of every decision's span.
const SpanName = "sluice.decision"

// A Tracer makes the spans of decisions. The zero of *Tracer, nil, makes
// none.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TextMapPropagator
}

// New traces decisions with tp, parented to the W3C trace context each call
// carries.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{t: tp.Tracer("github.com/sluice-rl/sluice"), prop: propagation.TraceContext{}}
}

// A Span is one decision's span. The zero Span does nothing.
type Span struct{ s trace.Span }

// Start begins a decision's span for a call from via, parented to the trace
// context carrier holds.
func (t *Tracer) Start(ctx context.Context, via string, carrier propagation.TextMapCarrier) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx = t.prop.Extract(ctx, carrier)
	ctx, s := t.t.Start(ctx, SpanName, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("sluice.via", via)))
	return ctx, Span{s}
}

// StartHTTP is Start with the trace context of an HTTP request's header.
func (t *Tracer) StartHTTP(ctx context.Context, via string, h http.Header) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	return t.Start(ctx, via, propagation.HeaderCarrier(h))
}

// HeaderFunc is a carrier that reads header fields with a function, for an
// HTTP stack without http.Header (the fasthttp gateway).
type HeaderFunc func(name string) string

// Get implements propagation.TextMapCarrier.
func (f HeaderFunc) Get(key string) string { return f(key) }

// Set implements propagation.TextMapCarrier; a request's fields are read,
// never written.
func (HeaderFunc) Set(string, string) {}

// Keys implements propagation.TextMapCarrier: the W3C propagator does not
// need them.
func (HeaderFunc) Keys() []string { return nil }

// MetadataCarrier is a carrier of a gRPC call's metadata (a metadata.MD
// converts to it), whose keys are lower case.
type MetadataCarrier map[string][]string

// Get implements propagation.TextMapCarrier.
func (m MetadataCarrier) Get(key string) string {
	if v := m[strings.ToLower(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (m MetadataCarrier) Set(key, value string) { m[strings.ToLower(key)] = []string{value} }

// Keys implements propagation.TextMapCarrier.
func (m MetadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, strings.ToLower(k))
	}
	return keys
}

// SetDomain records an Envoy call's domain.
func (s Span) SetDomain(domain string) {
	if s.s != nil {
		s.s.SetAttributes(attribute.String("sluice.domain", domain))
	}
}

// End ends the span with what res decided; err, if not nil, is why no
// decision was made (a request that cannot be checked), recorded as the
// span's error.
func (s Span) End(res *engine.Result, err error) {
	if s.s == nil {
		return
	}
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
		s.s.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 9)
	attrs = append(attrs,
		attribute.Bool("sluice.allowed", res.Allowed),
		attribute.String("sluice.outcome", res.Reason.String()),
		attribute.Int("sluice.rules", len(res.Statuses)),
		attribute.Bool("sluice.degraded", res.Degraded()))
	if d := res.Decision; d.Rule != "" {
		attrs = append(attrs, attribute.String("sluice.rule", d.Rule), attribute.Int64("sluice.remaining", d.Remaining))
		if !res.Allowed {
			attrs = append(attrs, attribute.Int64("sluice.retry_after_ms", d.RetryAfter.Milliseconds()))
		}
	}
	if res.StoreTime > 0 {
		attrs = append(attrs, attribute.Float64("sluice.store.duration_ms", float64(res.StoreTime.Microseconds())/1000))
	}
	s.s.SetAttributes(attrs...)
	s.s.End()
}

// Fields are the request fields that carry a trace context, when t traces
// (nil traces nothing): a server that keeps only the fields it reads keeps
// these too.
func (t *Tracer) Fields() []string {
	if t == nil {
		return nil
	}
	return []string{"traceparent", "tracestate"}
}

// Pipeline is t as the request pipeline of package httplimit calls it
// (httplimit.Options.Tracer): nil when t is nil, so that tracing off costs
// the pipeline nothing.
func (t *Tracer) Pipeline() httplimit.Tracer {
	if t == nil {
		return nil
	}
	return pipelineTracer{t}
}

type pipelineTracer struct{ t *Tracer }

func (p pipelineTracer) StartDecision(ctx context.Context, via string, header httplimit.HeaderCarrier) (context.Context, httplimit.DecisionSpan) {
	return p.t.Start(ctx, via, header)
}

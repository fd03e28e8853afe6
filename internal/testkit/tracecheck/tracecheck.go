// Package tracecheck checks the spans sluice makes of its decisions, for
// the tests of every face (the JSON API, forward-auth, the gateway's
// planes, Envoy's call on both gRPC servers), so that each is held to the
// same span.
package tracecheck

import (
	"testing"

	"github.com/sluice-rl/sluice/tracing"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The caller's trace context each face is sent.
const (
	TraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	TraceParent = "00-" + TraceID + "-00f067aa0ba902b7-01"
	// Rules allow one request an hour per client address.
	Rules = "trustedProxies: [127.0.0.1/32]\nrules:\n  - id: per-ip\n    key: [ip]\n    rate: 1\n    per: 1h\n"
)

// TwoDecisions runs run, which makes two decisions through a face with tr,
// and checks that the face made one span of each, the child of
// TraceParent, naming via and rule, the second refused unless
// bothAllowed.
func TwoDecisions(t *testing.T, via, rule string, bothAllowed bool, run func(t *testing.T, tr *tracing.Tracer)) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	run(t, tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans for 2 decisions", len(spans))
	}
	for i, s := range spans {
		a := map[string]string{}
		for _, kv := range s.Attributes() {
			a[string(kv.Key)] = kv.Value.Emit()
		}
		if s.Parent().TraceID().String() != TraceID || s.Name() != tracing.SpanName {
			t.Fatalf("span %d: %q, parent %v", i, s.Name(), s.Parent())
		}
		wantAllowed := "true"
		if i == 1 && !bothAllowed {
			wantAllowed = "false"
		}
		if a["sluice.via"] != via || a["sluice.rule"] != rule || a["sluice.allowed"] != wantAllowed {
			t.Fatalf("span %d attributes %v: want via %s, rule %s, allowed %s", i, a, via, rule, wantAllowed)
		}
	}
}

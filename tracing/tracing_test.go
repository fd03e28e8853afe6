package tracing

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func recorder() (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), rec
}

func testEngine(t testing.TB) *engine.Engine {
	t.Helper()
	cfg, err := rules.Parse("t.yaml", []byte("rules:\n  - id: per-user\n    key: [user]\n    rate: 2\n    per: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// A decision's span is the child of the caller's traceparent and says what
// was decided.
func TestADecisionsSpanIsTheCallersChildAndSaysWhatWasDecided(t *testing.T) {
	tr, rec := recorder()
	e := testEngine(t)
	req := &rules.Request{Attributes: map[string]string{"user": "u1"}}
	h := http.Header{"Traceparent": {parent}}
	var res engine.Result
	for range 3 {
		ctx, span := tr.StartHTTP(context.Background(), "http", h)
		err := e.Check(ctx, req, engine.CheckOptions{}, &res)
		span.End(&res, err)
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans for 3 decisions", len(spans))
	}
	for i, s := range spans {
		a := attrs(s)
		if s.Name() != SpanName || s.SpanKind() != trace.SpanKindServer {
			t.Fatalf("span %d: %q kind %v", i, s.Name(), s.SpanKind())
		}
		if got := s.Parent().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent().SpanID().String() != "00f067aa0ba902b7" || !s.Parent().IsRemote() {
			t.Fatalf("span %d: parent %v, want the traceparent's", i, s.Parent())
		}
		if s.SpanContext().TraceID() != s.Parent().TraceID() {
			t.Fatalf("span %d is not in the caller's trace", i)
		}
		wantAllowed, wantOutcome := i < 2, "ok"
		if !wantAllowed {
			wantOutcome = "limited"
		}
		if a["sluice.via"].AsString() != "http" || a["sluice.rule"].AsString() != "per-user" ||
			a["sluice.allowed"].AsBool() != wantAllowed || a["sluice.outcome"].AsString() != wantOutcome ||
			a["sluice.remaining"].AsInt64() != int64(max(1-i, 0)) || a["sluice.rules"].AsInt64() != 1 || a["sluice.degraded"].AsBool() {
			t.Fatalf("span %d attributes: %v", i, s.Attributes())
		}
		_, hasRetry := a["sluice.retry_after_ms"]
		if hasRetry != !wantAllowed || !wantAllowed && a["sluice.retry_after_ms"].AsInt64() <= 0 {
			t.Fatalf("span %d: retry_after_ms %v", i, a["sluice.retry_after_ms"])
		}
		if _, ok := a["sluice.store.duration_ms"]; ok {
			t.Fatalf("span %d: a store time on the embedded store", i)
		}
		for _, kv := range s.Attributes() {
			if kv.Value.AsString() == "u1" {
				t.Fatalf("span %d records the key: %v", i, kv)
			}
		}
	}
}

// Without a traceparent the span starts a trace; with gRPC metadata it is
// read as from HTTP; an error is recorded as the span's.
func TestTheOtherCarriers(t *testing.T) {
	tr, rec := recorder()
	ctx, span := tr.Start(context.Background(), "gateway", HeaderFunc(func(string) string { return "" }))
	if trace.SpanFromContext(ctx).SpanContext().TraceID() == (trace.TraceID{}) {
		t.Fatal("no trace started without a traceparent")
	}
	span.End(&engine.Result{Allowed: true}, nil)
	_, span = tr.Start(context.Background(), "envoy", MetadataCarrier{"traceparent": {parent}})
	span.SetDomain("shop")
	span.End(nil, context.DeadlineExceeded)
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Parent().IsValid() {
		t.Fatalf("without traceparent: %d spans, parent %v", len(spans), spans[0].Parent())
	}
	g := spans[1]
	if g.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || attrs(g)["sluice.domain"].AsString() != "shop" {
		t.Fatalf("gRPC: parent %v, attributes %v", g.Parent(), g.Attributes())
	}
	if g.Status().Code.String() != "Error" || len(g.Events()) == 0 {
		t.Fatalf("an error: status %v, events %v", g.Status(), g.Events())
	}
}

// A store that takes a while: its time is the span's store time.
type slowStore struct {
	sluice.Store
	d time.Duration
}

func (s slowStore) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	time.Sleep(s.d)
	return s.Store.Take(ctx, takes, out)
}

func (s slowStore) Blocking() bool { return true }

func TestStoreTimeIsTheRemoteStoresTime(t *testing.T) {
	cfg, _ := rules.Parse("t.yaml", []byte("rules:\n  - id: a\n    key: [user]\n    rate: 2\n    per: 1m\n"))
	e, err := engine.New(cfg, engine.Options{Store: slowStore{memory.New(), 3 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	tr, rec := recorder()
	var res engine.Result
	ctx, span := tr.StartHTTP(context.Background(), "http", http.Header{})
	span.End(&res, e.Check(ctx, &rules.Request{Attributes: map[string]string{"user": "u"}}, engine.CheckOptions{}, &res))
	// At least the store's own sleep (a lower bound the store guarantees,
	// not a timing the machine decides).
	if res.StoreTime < 3*time.Millisecond {
		t.Fatalf("StoreTime %v, want at least the store's 3ms", res.StoreTime)
	}
	if got := attrs(rec.Ended()[0])["sluice.store.duration_ms"].AsFloat64(); got < 3 {
		t.Fatalf("sluice.store.duration_ms %v", got)
	}
}

// decide returns one traced decision of a user limited 2 a minute, with the
// caller's traceparent, as the APIs make it.
func decide(tb testing.TB, tr *Tracer) func() {
	e := testEngine(tb)
	req := &rules.Request{Attributes: map[string]string{"user": "u1"}}
	h := http.Header{"Traceparent": {parent}}
	var res engine.Result
	return func() {
		ctx, span := tr.StartHTTP(context.Background(), "http", h)
		span.End(&res, e.Check(ctx, req, engine.CheckOptions{}, &res))
	}
}

// Tracing off costs no allocation: a nil Tracer's Start and End, on the
// HTTP and the gRPC carriers.
func TestOffAllocatesNothing(t *testing.T) {
	var tr *Tracer
	one := decide(t, tr)
	allocs := testing.AllocsPerRun(1000, func() {
		one()
		_, span := tr.Start(context.Background(), "envoy", MetadataCarrier(nil))
		span.SetDomain("d")
		span.End(nil, nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decision with tracing off", allocs)
	}
}

func BenchmarkOff(b *testing.B) {
	one := decide(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		one()
	}
}

func BenchmarkOn(b *testing.B) {
	one := decide(b, New(sdktrace.NewTracerProvider())) // spans made and ended, not exported
	b.ReportAllocs()
	for b.Loop() {
		one()
	}
}

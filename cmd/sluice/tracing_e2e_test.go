package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP trace receiver on loopback that keeps the spans
// it is sent.
type collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	names []string // service.name of each span's resource
}

func startCollector(t *testing.T) (string, *collector) {
	t.Helper()
	c := &collector{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "not a trace export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			name := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					name = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					c.spans = append(c.spans, s)
					c.names = append(c.names, name)
				}
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), c
}

func (c *collector) got() ([]*tracepb.Span, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.spans...), append([]string(nil), c.names...)
}

// The built binary (serve, then gateway) with the standard OpenTelemetry
// variables sends a span per decision to an OTLP/HTTP collector, in the
// caller's trace when it sent a traceparent; OTEL_SDK_DISABLED=true sends
// nothing.
func TestServeAndGatewaySendASpanPerDecisionEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	endpoint, col := startCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_SERVICE_NAME", "edge-limiter")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--config", "../../examples/shop.yaml")
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	for i := range 3 {
		req, _ := http.NewRequest("POST", base+"/v1/check", strings.NewReader(`{"attributes":{"user":"u42"}}`))
		req.Header.Set("traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
		if i == 2 {
			req.Header.Del("traceparent")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var spans []*tracepb.Span
	var names []string
	for end := time.Now().Add(20 * time.Second); len(spans) < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d spans reached the collector in 20 s, want 3", len(spans))
		}
		spans, names = col.got()
	}
	inTrace := 0
	for i, s := range spans {
		if s.Name != "sluice.decision" || names[i] != "edge-limiter" {
			t.Fatalf("span %d: %q of service %q", i, s.Name, names[i])
		}
		rule := ""
		for _, kv := range s.Attributes {
			if kv.Key == "sluice.rule" {
				rule = kv.GetValue().GetStringValue()
			}
		}
		if rule == "" {
			t.Fatalf("span %d names no rule: %v", i, s.Attributes)
		}
		if strings.EqualFold(bytesHex(s.TraceId), trace) {
			inTrace++
			if bytesHex(s.ParentSpanId) != "00f067aa0ba902b7" {
				t.Fatalf("span %d in the caller's trace has parent %s", i, bytesHex(s.ParentSpanId))
			}
		}
	}
	if inTrace != 2 {
		t.Fatalf("%d spans in the caller's trace, want 2 (the third call sent no traceparent)", inTrace)
	}

	// The gateway (its default plane) too.
	up := httptestServer(t)
	gw, _ := start(t, "gateway", "--config", "../../examples/shop.yaml", "--upstream", up, "--listen", "127.0.0.1:0", "--admin-listen", freeAddr(t), "--watch", "0")
	req, _ := http.NewRequest("GET", gw+"/products", nil)
	req.Header.Set("traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		spans, _ = col.got()
		if via := viaOf(spans[len(spans)-1]); len(spans) == 4 && via == "gateway" {
			break
		} else if time.Now().After(end) {
			t.Fatalf("no gateway span in 20 s: %d spans, the last via %q", len(spans), via)
		}
	}

	// OTEL_SDK_DISABLED turns it off, even with an endpoint: no span, not
	// even when the process flushes at exit.
	endpoint2, col2 := startCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint2)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	base2, cmd := start(t, "serve", "--listen", "127.0.0.1:0", "--config", "../../examples/shop.yaml")
	resp, err = http.Post(base2+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"u42"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if s, _ := col2.got(); len(s) != 0 {
		t.Fatalf("tracing disabled sent %d spans", len(s))
	}
}

func bytesHex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func viaOf(s *tracepb.Span) string {
	for _, kv := range s.Attributes {
		if kv.Key == "sluice.via" {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// httptestServer is an upstream answering 200 to everything.
func httptestServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

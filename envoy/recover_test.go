package envoy

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/metrics"
)

// A method that panics on grpc-go is answered Internal, and the panic is
// logged and counted.
func TestAPanickingMethodIsAnsweredInternalAndCounted(t *testing.T) {
	m := metrics.New("test")
	var log strings.Builder
	for range 2 {
		_, err := unaryRecover(m, slog.New(slog.NewTextHandler(&log, nil)))(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x"},
			func(context.Context, any) (any, error) { panic("boom") })
		if status.Code(err) != codes.Internal {
			t.Fatalf("a panic over gRPC: %v", err)
		}
	}
	if !strings.Contains(log.String(), "method=/x") {
		t.Fatalf("the panic's log: %q", log.String())
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var grpcPanics float64
	for _, f := range families {
		for _, s := range f.GetMetric() {
			if f.GetName() == "sluice_panics_total" && len(s.GetLabel()) == 1 && s.GetLabel()[0].GetValue() == "grpc" {
				grpcPanics = s.GetCounter().GetValue()
			}
		}
	}
	if grpcPanics != 2 {
		t.Fatalf("counted %v panics over gRPC, want 2", grpcPanics)
	}
}

package metrics

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A panic below either boundary is answered (500 with a problem, or gRPC
// Internal) and counted by boundary; http.ErrAbortHandler, the deliberate
// abort, passes through uncounted.
func TestPanicsAreAnsweredAndCountedAtEachBoundary(t *testing.T) {
	m := New("t")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	w := httptest.NewRecorder()
	m.Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("x") }), quiet).
		ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 500 || !strings.Contains(w.Header().Get("Content-Type"), "problem+json") {
		t.Fatalf("a panic over HTTP: %d %q %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	func() {
		defer func() {
			if recover() != http.ErrAbortHandler {
				t.Error("ErrAbortHandler was swallowed")
			}
		}()
		m.Recover(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }), quiet).
			ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}()
	for range 2 {
		_, err := m.UnaryRecover(quiet)(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x"},
			func(context.Context, any) (any, error) { panic("boom") })
		if status.Code(err) != codes.Internal {
			t.Fatalf("a panic over gRPC: %v", err)
		}
	}
	if h, g := m.panics.http.Load(), m.panics.grpc.Load(); h != 1 || g != 2 {
		t.Fatalf("counted %d over HTTP and %d over gRPC, want 1 and 2", h, g)
	}
}

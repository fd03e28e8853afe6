package metrics

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
	if h := m.panics.http.Load(); h != 1 {
		t.Fatalf("counted %d over HTTP, want 1", h)
	}
}

package metrics

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync/atomic"

	"github.com/sluice-rl/sluice/httplimit"
)

// No input may take the process down. Every request enters through one of
// two boundaries, an HTTP handler or a gRPC method, and each recovers a
// panic into an answer: 500 with a problem+json body, or gRPC Internal. The
// panic is logged with its stack and counted (sluice_panics_total), so a
// bug that a request can trigger is seen and fixed, not hidden. The client
// always gets an answer; its connection is never just dropped.

// panics counts recovered panics, by boundary.
type panics struct {
	http, grpc atomic.Uint64
}

// The boundaries Panicked counts at.
const (
	HTTP = "http"
	GRPC = "grpc"
)

// Panicked counts a panic recovered at boundary (HTTP or GRPC) and logs it
// with the stack and args (the method, the path); the caller answers. Call
// it from the deferred function that recovered v.
func (m *Metrics) Panicked(log *slog.Logger, boundary string, v any, args ...any) {
	msg := "sluice: recovered from a panic while serving a request"
	if boundary == GRPC {
		m.panics.grpc.Add(1)
		msg = "sluice: recovered from a panic while serving a gRPC call"
	} else {
		m.panics.http.Add(1)
	}
	log.Error(msg, append(args, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))...)
}

// Recover wraps h so that a panic while serving a request is answered with
// 500 and a problem+json body, logged and counted, instead of dropping the
// connection. http.ErrAbortHandler, the deliberate way to abort a response,
// is passed on.
func (m *Metrics) Recover(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			m.Panicked(log, HTTP, v, "method", r.Method, "path", r.URL.Path)
			// If the handler had already written a status, this adds to a
			// broken response; the connection still gets an end.
			httplimit.WriteProblem(w, &httplimit.Problem{Type: "about:blank", Title: "Internal Server Error",
				Status: http.StatusInternalServerError, Detail: "sluice could not answer this request"})
		}()
		h.ServeHTTP(w, r)
	})
}

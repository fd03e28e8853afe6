package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// Recover wraps h so that a panic while serving a request is answered with
// 500 and a problem+json body, logged and counted, instead of dropping the
// connection. http.ErrAbortHandler, the deliberate way to abort a response,
// is passed on.
func (s *Server) Recover(h http.Handler) http.Handler {
	return recoverHTTP(h, &s.metrics.panics, s.log)
}

func recoverHTTP(h http.Handler, n *panics, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			n.http.Add(1)
			log.Error("sluice: recovered from a panic while serving a request",
				"method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			// If the handler had already written a status, this adds to a
			// broken response; the connection still gets an end.
			writeProblem(w, http.StatusInternalServerError, "Internal Server Error", "sluice could not answer this request", "")
		}()
		h.ServeHTTP(w, r)
	})
}

// UnaryRecover is a gRPC interceptor that answers a panicking method with
// codes.Internal, logged and counted, instead of crashing the process.
func (s *Server) UnaryRecover() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				s.metrics.panics.grpc.Add(1)
				s.log.Error("sluice: recovered from a panic while serving a gRPC call",
					"method", info.FullMethod, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				resp, err = nil, status.Error(codes.Internal, "sluice could not answer this request")
			}
		}()
		return handler(ctx, req)
	}
}

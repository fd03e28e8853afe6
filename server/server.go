package server

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/store/memory"
)

// Options configure a Server.
type Options struct {
	Engine *engine.Engine
	// Memory, when the engine's store is the embedded one, lets /metrics
	// report its keys and evictions.
	Memory *memory.Store
	// HTTP shapes the headers of answers, as the middleware would.
	HTTP httplimit.Options
	// AdminToken guards the admin endpoints. Without one they are open on a
	// loopback listener and refused on any other.
	AdminToken string
	// AuthProxy is the proxy that calls the forward-auth endpoint (default
	// nginx): it decides which forwarding headers are believed.
	AuthProxy AuthProxy
	// Loopback tells whether the listener is on a loopback address.
	Loopback bool
	// Metrics, if set, are the metrics to serve; make them with NewMetrics
	// before the engine, so the engine can report store calls to them
	// (engine.Options.OnStoreCall = m.ObserveStoreCall).
	Metrics *Metrics
	Logger  *slog.Logger
}

// Server is the service's HTTP handler.
type Server struct {
	o       Options
	e       *engine.Engine
	limiter *httplimit.Limiter
	mux     *http.ServeMux
	handler http.Handler // mux behind the panic boundary
	metrics *Metrics
	log     *slog.Logger
}

// New returns a server for o.Engine.
func New(o Options) (*Server, error) {
	if o.Engine == nil {
		return nil, errors.New("server: Options.Engine is required")
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics("")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o, e: o.Engine, limiter: httplimit.New(o.Engine, o.HTTP), mux: http.NewServeMux(), log: o.Logger, metrics: o.Metrics}
	s.metrics.watch(o.Engine, o.Memory)
	s.mux.HandleFunc("POST /v1/check", s.check)
	s.mux.HandleFunc("POST /v1/check:batch", s.checkBatch)
	s.mux.HandleFunc("POST /v1/charge", s.charge)
	s.mux.HandleFunc("GET /v1/auth", s.auth)
	s.mux.HandleFunc("POST /v1/auth", s.auth)
	s.mux.HandleFunc("/v1/auth/", s.auth) // Envoy ext_authz: /v1/auth + the original path
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /v1/rules", s.admin(s.listRules))
	s.mux.HandleFunc("GET /v1/state", s.admin(s.getState))
	s.mux.HandleFunc("DELETE /v1/state", s.admin(s.deleteState))
	s.handler = s.Recover(s.mux)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// ready answers 200 when the rules are loaded and the store answers, or
// when every rule would fail open anyway; 503 otherwise.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	err := s.e.Ping(r.Context())
	if err == nil {
		w.Write([]byte("ready\n"))
		return
	}
	for _, rule := range s.e.Config().Rules {
		if rule.FailClosed {
			http.Error(w, "store unreachable and rule "+rule.ID+" fails closed", http.StatusServiceUnavailable)
			return
		}
	}
	w.Write([]byte("ready (store unreachable: failing open)\n"))
}

// IsLoopback reports whether a listen address is on a loopback interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

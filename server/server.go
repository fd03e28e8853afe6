package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"

	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/tracing"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/metrics"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/store/memory"
)

// Options configure a Server.
type Options struct {
	Engine *engine.Engine
	// Region is this gateway's region (--region): rule descriptions name
	// the share of a rule with regions that it enforces.
	Region string
	// Memory, when the engine's store is the embedded one, lets /metrics
	// report its keys and evictions.
	Memory *memory.Store
	// HTTP shapes the headers of answers, as the middleware would.
	HTTP httplimit.Options
	// AdminToken guards the admin endpoints. Without one they are open on a
	// loopback listener and refused on any other.
	AdminToken string
	// Share, if set, is the sync layer around the store: its store calls,
	// leases, deny cache and hot keys are served by /metrics and
	// /v1/admin/hot.
	Share *share.Store
	// AuthProxy is the proxy that calls the forward-auth endpoint (default
	// nginx): it decides which forwarding headers are believed.
	AuthProxy AuthProxy
	// Loopback tells whether the listener is on a loopback address.
	Loopback bool
	// AdminHosts are host names, besides loopback addresses and localhost,
	// that requests to the admin endpoints without a token may name in
	// their Host (for a listener reached under a name of its own).
	AdminHosts []string
	// Metrics, if set, are the metrics to serve; make them with metrics.New
	// before the engine, so the engine can report store calls to them
	// (storecall.Options.OnCall = m.ObserveStoreCall).
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	// Pressure, if set, is the factor rules marked adaptive follow: GET and
	// PUT /v1/pressure (admin) read it and set an operator's factor.
	Pressure *concurrency.Pressure
	// Live, if set, feeds the live page (/ui) and its JSON (/v1/ui/state):
	// see Live.
	Live *Live
	// Upstream, if set, is checked by /readyz too: the gateway is not ready
	// while what it protects cannot be reached. It returns a description
	// of the upstream and an error when it is down.
	Upstream func(ctx context.Context) (string, error)
	// Rules, if set, is where the rules come from when not from files (an
	// xDS subscription): /readyz is not ready until it has delivered a
	// configuration, and /metrics reports its updates.
	Rules RulesSource
	// Tracer, if set, makes an OpenTelemetry span of each decision on every
	// API (package tracing); nil traces nothing.
	Tracer *tracing.Tracer
	// Overrides, if set, are the operators' overrides this process
	// follows: /v1/overrides (admin) lists and changes them.
	Overrides *overrides.Follower
}

// RulesSource is a source of rules other than files, such as an xDS
// subscription (package envoy/xds).
type RulesSource = metrics.RulesSource

// Server is the service's HTTP handler.
type Server struct {
	o       Options
	e       *engine.Engine
	limiter *httplimit.Limiter
	mux     *http.ServeMux
	handler http.Handler // mux behind the panic boundary
	metrics *metrics.Metrics
	log     *slog.Logger
}

// New returns a server for o.Engine.
func New(o Options) (*Server, error) {
	if o.Engine == nil {
		return nil, errors.New("server: Options.Engine is required")
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New("")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o, e: o.Engine, limiter: httplimit.New(o.Engine, withTracer(o.HTTP, o.Tracer, "http")), mux: http.NewServeMux(), log: o.Logger, metrics: o.Metrics}
	s.metrics.Watch(o.Engine, o.Memory, o.Share)
	if o.Overrides != nil {
		s.metrics.WatchOverrides(o.Overrides.Current)
	}
	s.mux.HandleFunc("POST /v1/check", s.check)
	s.mux.HandleFunc("POST /v1/check:batch", s.checkBatch)
	s.mux.HandleFunc("POST /v1/charge", s.charge)
	s.mux.HandleFunc("POST /v1/reserve", s.reserve)
	s.mux.HandleFunc("POST /v1/settle", s.settle)
	s.mux.HandleFunc("GET /v1/auth", s.auth)
	s.mux.HandleFunc("POST /v1/auth", s.auth)
	s.mux.HandleFunc("/v1/auth/", s.auth) // Envoy ext_authz: /v1/auth + the original path
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.HandleFunc("GET /metrics", s.scrape(promhttp.HandlerFor(s.metrics.Registry(), promhttp.HandlerOpts{})))
	s.mux.HandleFunc("GET /v1/rules", s.admin(s.listRules))
	s.mux.HandleFunc("GET /v1/state", s.admin(s.getState))
	s.mux.HandleFunc("DELETE /v1/state", s.admin(s.deleteState))
	s.mux.HandleFunc("GET /v1/admin/hot", s.admin(s.hot))
	s.mux.HandleFunc("GET /v1/pressure", s.admin(s.getPressure))
	s.mux.HandleFunc("PUT /v1/pressure", s.admin(s.putPressure))
	s.mux.HandleFunc("GET /v1/overrides", s.admin(s.listOverrides))
	s.mux.HandleFunc("PUT /v1/overrides", s.admin(s.putOverride))
	s.mux.HandleFunc("GET /v1/overrides/{id}", s.admin(s.getOverride))
	s.mux.HandleFunc("DELETE /v1/overrides/{id}", s.admin(s.deleteOverride))
	// The page holds no data: it fetches it from /v1/ui/state, an admin
	// endpoint, with the token from the page's #token= fragment, which never
	// reaches a server or a log.
	s.mux.HandleFunc("GET /ui", s.livePage)
	s.mux.HandleFunc("GET /v1/ui/state", s.admin(s.liveState))
	s.mux.HandleFunc("GET /{$}", index)
	s.handler = s.metrics.Recover(s.mux, s.log)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// ready answers 200 when every rule can answer: the store answers (its
// scripts loaded), or it does not and every enforced rule fails open (then
// within its share of the limit). It answers 503 naming the fail-closed
// rules when the store does not answer. The body says which state holds,
// the store's error, each store node's breaker and the gateway count.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	// The first lines are the verdict, "ready" or each reason it is not;
	// the details follow.
	var notReady []string
	var b strings.Builder // the details
	degraded := false
	pingErr := s.e.Store().Ping(r.Context())
	if err := pingErr; err != nil {
		var closed []string
		for _, rule := range s.e.Config().Rules {
			if rule.FailClosed && !rule.Shadow {
				closed = append(closed, rule.ID)
			}
		}
		switch {
		case !s.e.Store().Reached():
			// Never answered since start: as likely a wrong address as an
			// outage, and a gateway that would share nothing. Not ready,
			// so that a deployment with a typo in its store URL stops.
			notReady = append(notReady, "the store has not answered since sluice started (is its URL right?); meanwhile every rule fails open within its share, or closed")
		case len(closed) > 0:
			notReady = append(notReady, "degraded: the store does not answer, and these rules fail closed: "+strings.Join(closed, ", "))
		default:
			degraded = true
		}
		fmt.Fprintf(&b, "store error: %v\n", err)
	}
	if pingErr == nil && !s.e.LimitsKnown() {
		// The store answers, but a key whose limit another process changed
		// would start afresh here. (While it does not answer, the rules
		// fail open or closed as above.)
		notReady = append(notReady, "the limits the other processes on the store count under have not been read since the store last failed; meanwhile a key whose limit changed elsewhere could start afresh")
	}
	states := s.e.Store().BreakerStates()
	nodes := make([]string, 0, len(states))
	for n := range states {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		if n == "" {
			fmt.Fprintf(&b, "breaker: %s\n", states[n])
		} else {
			fmt.Fprintf(&b, "breaker %s: %s\n", n, states[n])
		}
	}
	fmt.Fprintf(&b, "gateways sharing the store: %d\n", s.e.Gateways())
	if s.o.Rules != nil {
		if v, ok := s.o.Rules.Version(); !ok {
			notReady = append(notReady, "no configuration has come from the xDS management server yet")
		} else if !s.o.Rules.Connected() {
			fmt.Fprintf(&b, "rules: version %q from xDS, kept while the management server cannot be reached\n", v)
		} else {
			fmt.Fprintf(&b, "rules: version %q from xDS\n", v)
		}
	}
	if s.o.Upstream != nil {
		name, uerr := s.o.Upstream(r.Context())
		if uerr != nil {
			notReady = append(notReady, fmt.Sprintf("the upstream %s cannot be reached: %v", name, uerr))
		} else {
			fmt.Fprintf(&b, "upstream %s: reachable\n", name)
		}
	}
	var head strings.Builder
	status := http.StatusOK
	switch {
	case len(notReady) > 0:
		status = http.StatusServiceUnavailable
		for _, why := range notReady {
			fmt.Fprintf(&head, "not ready: %s\n", why)
		}
	case degraded:
		head.WriteString("ready (degraded: the store does not answer; every rule fails open within its share)\n")
	default:
		head.WriteString("ready\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(head.String() + b.String()))
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

// withTracer is o with the service's tracer, if o has none.
func withTracer(o httplimit.Options, t *tracing.Tracer, via string) httplimit.Options {
	if o.Tracer == nil {
		o.Tracer, o.TraceVia = t.Pipeline(), via
	}
	return o
}

// index names what the listener serves, for whoever opens it in a browser
// or curls it first.
func index(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, `sluice: a rate limiter for HTTP and gRPC APIs. This listener serves:

  GET  /ui                the live page (admin: a token in /ui#token=... beyond loopback)
  GET  /metrics           Prometheus metrics
  GET  /healthz, /readyz  liveness, readiness (why, when not ready)
  POST /v1/check          a decision: {"request":{"method":"POST","path":"/login","ip":"203.0.113.7"},"attributes":{"user":"u42"}}
  POST /v1/check:batch, /v1/charge, /v1/reserve, /v1/settle
  GET  /v1/auth           forward-auth for nginx, Traefik, Caddy, Envoy
  GET  /v1/rules, /v1/state, /v1/pressure   admin

https://github.com/sluice-rl/sluice
`)
}

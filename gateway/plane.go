package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/metrics"
)

// Planes names the data planes, the default first: "fasthttp" (Fast, the
// faster, HTTP/1.x to clients) and "net/http" (Handler in an http.Server,
// HTTP/2 to clients too).
var Planes = []string{"fasthttp", "net/http"}

// Plane is a gateway data plane, ready to serve.
type Plane interface {
	// Serve serves the connections ln accepts until Shutdown.
	Serve(ln net.Listener) error
	// Shutdown stops accepting, then waits for the requests in flight,
	// or until ctx ends.
	Shutdown(ctx context.Context) error
	// Protocols are what the plane speaks, for TLS's ALPN.
	Protocols() []string
}

// New returns the data plane named plane (one of Planes) in front of
// upstream: the one way to make either.
func New(plane string, upstream *url.URL, e *engine.Engine, o Options) (Plane, error) {
	switch plane {
	case "fasthttp":
		return NewFast(upstream, e, o), nil
	case "net/http":
		return &netHTTP{http.Server{
			Handler: Handler(upstream, e, o), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		}}, nil
	}
	return nil, fmt.Errorf("unknown data plane %q: want fasthttp or net/http", plane)
}

// netHTTP is the net/http plane: Handler in a server with the timeouts
// every sluice listener has.
type netHTTP struct{ http.Server }

func (p *netHTTP) Protocols() []string { return []string{"h2", "http/1.1"} }

// Options configure either data plane: the two take the same options and
// behave the same (the plane conformance suite in this package holds them
// to it).
type Options struct {
	// HTTP shapes the answers and holds the concurrency limit and the
	// pressure signal, if any (see httplimit.Options).
	HTTP    httplimit.Options
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Timeout bounds one upstream exchange: connecting, sending the
	// request and having the answer's head (default 30 s). A slow upstream
	// gives 504, an unreachable one 502.
	Timeout time.Duration
	// MaxConns bounds the connections to the upstream (default 1024).
	MaxConns int
	// UpstreamIdle is the most an idle connection to the upstream is kept
	// (default DefaultUpstreamIdle), and less if the upstream announces a
	// shorter keep-alive (Keep-Alive: timeout=N).
	UpstreamIdle time.Duration
	// Upgrades says how protocol upgrades (WebSocket) are passed on.
	Upgrades Upgrades
	// UpstreamTLS configures TLS to an https upstream (default: the
	// system's roots, the upstream URL's host name).
	UpstreamTLS *tls.Config
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New("")
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1024
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.UpstreamIdle <= 0 {
		o.UpstreamIdle = DefaultUpstreamIdle
	}
	o.HTTP.RewritePath = true // the upstream serves the path that was limited
	if o.HTTP.TraceVia == "" {
		o.HTTP.TraceVia = "gateway"
	}
}

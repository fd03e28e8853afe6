package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
)

// Gateway returns a reverse proxy to upstream with the rate-limiting
// middleware in front: `sluice gateway`.
//
// X-Forwarded-For is rebuilt for the upstream: the client address is
// appended to the chain received from a trusted proxy, and any chain sent by
// an untrusted peer is dropped. An unreachable upstream gives 502 with a
// problem+json body. A panic while serving a request is answered with 500,
// logged and counted in m (which may be nil), never a dropped connection.
func Gateway(upstream *url.URL, e *engine.Engine, o httplimit.Options, log *slog.Logger, m *Metrics) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	if m == nil {
		m = NewMetrics("")
	}
	proxy := &httputil.ReverseProxy{
		Transport: UpstreamTransport(TransportOptions{}),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Host = pr.In.Host
			trusted := o.TrustedProxies
			if trusted == nil {
				trusted = e.Config().TrustedProxies
			}
			if peer := httplimit.ClientIP(&http.Request{RemoteAddr: pr.In.RemoteAddr}, nil); peer.IsValid() && containsAddr(trusted, peer) {
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away: nobody to answer
			}
			log.Warn("sluice: upstream unreachable", "upstream", upstream.Host, "error", err)
			writeProblem(w, http.StatusBadGateway, "Bad Gateway", "the upstream service did not answer", "")
		},
	}
	o.RewritePath = true // the upstream serves the path that was limited
	return recoverHTTP(httplimit.Middleware(e, o)(proxy), &m.panics, log)
}

// TransportOptions size the gateway's connections to its upstream.
type TransportOptions struct {
	// MaxIdlePerHost is how many idle keep-alive connections are kept per
	// upstream host (default 256). Go's default keeps 2: under 64
	// concurrent clients most requests would then open a new TCP
	// connection, and leave one in TIME_WAIT.
	MaxIdlePerHost int
	// IdleTimeout closes an idle connection after this long (default 90 s).
	IdleTimeout time.Duration
	// DialTimeout bounds connecting to the upstream (default 5 s).
	DialTimeout time.Duration
}

// UpstreamTransport returns the gateway's transport to its upstream:
// keep-alive connections sized for the load, HTTP/1.1 or HTTP/2 as the
// upstream offers.
func UpstreamTransport(o TransportOptions) *http.Transport {
	if o.MaxIdlePerHost <= 0 {
		o.MaxIdlePerHost = 256
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 90 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = max(o.MaxIdlePerHost, t.MaxIdleConns)
	t.MaxIdleConnsPerHost = o.MaxIdlePerHost
	t.IdleConnTimeout = o.IdleTimeout
	t.DialContext = (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	return t
}

// UpstreamCheck returns a readiness check for the gateway's upstream (see
// Options.Upstream): it opens a TCP connection to it, within a second.
func UpstreamCheck(upstream *url.URL) func(context.Context) (string, error) {
	addr := upstream.Host
	if upstream.Port() == "" {
		port := "80"
		if upstream.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(upstream.Hostname(), port)
	}
	return func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return addr, err
		}
		c.Close()
		return addr, nil
	}
}

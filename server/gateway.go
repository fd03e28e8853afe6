package server

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"

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

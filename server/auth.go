package server

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
)

// auth is the forward-auth endpoint for nginx auth_request, Traefik
// forwardAuth and Caddy forward_auth. The proxy sends the original request's
// headers, plus its method and URI in X-Forwarded-Method / X-Original-Method
// and X-Forwarded-Uri / X-Original-URI, and the client in X-Forwarded-For.
// Those headers are believed only from a trusted proxy: any other peer is
// refused with 403, since it could name any client. The answer is 200 with
// the RateLimit fields, or the middleware's full rejection (429 or 503, with
// Retry-After and a problem body).
func (s *Server) auth(w http.ResponseWriter, r *http.Request) {
	cfg := s.e.Config()
	trusted := s.o.HTTP.TrustedProxies
	if trusted == nil {
		trusted = cfg.TrustedProxies
	}
	peer := httplimit.ClientIP(&http.Request{RemoteAddr: r.RemoteAddr}, nil)
	if !peer.IsValid() || !containsAddr(trusted, peer) {
		writeProblem(w, http.StatusForbidden, "Forbidden",
			"forward-auth requests must come from a trusted proxy (trustedProxies in the rule file)", "")
		return
	}
	method := first(r.Header, "X-Forwarded-Method", "X-Original-Method")
	if method == "" {
		method = http.MethodGet
	}
	uri := first(r.Header, "X-Forwarded-Uri", "X-Original-Uri", "X-Original-URL")
	if uri == "" {
		uri = "/"
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "Bad Request", "the forwarded URI does not parse", "X-Forwarded-Uri")
		return
	}
	host := first(r.Header, "X-Forwarded-Host")
	if host == "" {
		host = r.Host
	}
	req := rules.Request{
		Method: strings.ToUpper(method), Host: host, Path: u.Path, RawQuery: u.RawQuery,
		ClientIP: httplimit.ClientIP(r, trusted), Header: r.Header,
	}
	var res engine.Result
	if err := s.e.Check(r.Context(), &req, engine.CheckOptions{}, &res); err != nil {
		writeBad(w, err)
		return
	}
	s.limiter.Headers(w.Header(), &res)
	if !res.Allowed {
		httplimit.WriteProblem(w, httplimit.ProblemFor(&res))
		return
	}
	w.WriteHeader(http.StatusOK)
}

func first(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

package server

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
)

// AuthProxy names the proxy that calls the forward-auth endpoint, and so the
// headers sluice believes for the original request's method, URI, host and
// client. A proxy passes the client's own headers through to the auth call,
// so sluice reads only the headers that this proxy sets and overwrites on
// every call, and ignores every other forwarding header a client could send:
//
//	proxy    method              URI               host               client
//	nginx    X-Original-Method   X-Original-URI    X-Forwarded-Host   X-Real-IP
//	traefik  X-Forwarded-Method  X-Forwarded-Uri   X-Forwarded-Host   X-Forwarded-For, from the right
//	caddy    X-Forwarded-Method  X-Forwarded-Uri   X-Forwarded-Host   X-Forwarded-For, from the right
//	envoy    the call's method   the call's path   the call's Host    X-Forwarded-For, from the right
//
// nginx's auth_request overwrites only the headers its snippet sets with
// proxy_set_header, so the shipped snippet sets those four. Traefik
// (trustForwardHeader: false) and Caddy replace the X-Forwarded-* headers
// a client sent; Envoy's ext_authz HTTP service sends the original method
// and path (after its path_prefix, /v1/auth) and appends the peer to
// X-Forwarded-For. "From the right" walks the chain from the nearest hop and
// skips trusted proxies, so a client's own X-Forwarded-For entries on the
// left are never reached while a trusted hop is in between.
type AuthProxy string

// The proxies the forward-auth endpoint knows.
const (
	AuthNginx   AuthProxy = "nginx"
	AuthTraefik AuthProxy = "traefik"
	AuthCaddy   AuthProxy = "caddy"
	AuthEnvoy   AuthProxy = "envoy"
)

// ParseAuthProxy checks a --auth-proxy value.
func ParseAuthProxy(s string) (AuthProxy, error) {
	switch p := AuthProxy(s); p {
	case AuthNginx, AuthTraefik, AuthCaddy, AuthEnvoy:
		return p, nil
	}
	return "", fmt.Errorf("unknown auth proxy %q: want nginx, traefik, caddy or envoy", s)
}

// authPrefix is where Envoy's ext_authz (path_prefix: /v1/auth) sends the
// original path.
const authPrefix = "/v1/auth"

// forwarded is what a proxy says of the request it is about to pass on.
type forwarded struct {
	method, uri, host string
	client            netip.Addr
}

// read takes the original request from the headers p sets.
func (p AuthProxy) read(r *http.Request, trusted []netip.Prefix) forwarded {
	switch p {
	case AuthTraefik, AuthCaddy:
		return forwarded{
			method: r.Header.Get("X-Forwarded-Method"), uri: r.Header.Get("X-Forwarded-Uri"),
			host: r.Header.Get("X-Forwarded-Host"), client: httplimit.ClientIPFromXFF(r, trusted),
		}
	case AuthEnvoy:
		uri := strings.TrimPrefix(r.URL.RequestURI(), authPrefix)
		if uri == "" || uri[0] != '/' {
			uri = "/" + uri
		}
		return forwarded{method: r.Method, uri: uri, host: r.Host, client: httplimit.ClientIPFromXFF(r, trusted)}
	}
	return forwarded{
		method: r.Header.Get("X-Original-Method"), uri: r.Header.Get("X-Original-Uri"),
		host: r.Header.Get("X-Forwarded-Host"), client: httplimit.ParseAddr(r.Header.Get("X-Real-Ip")),
	}
}

// auth is the forward-auth endpoint for nginx auth_request, Traefik
// forwardAuth, Caddy forward_auth and Envoy ext_authz. It is answered only
// for a trusted proxy: any other peer is refused with 403, since it could
// name any client. The original request is read from the headers its proxy
// type sets (see AuthProxy). The answer is 200 with the RateLimit fields, or
// the middleware's full rejection (429 or 503, with Retry-After and a
// problem body).
func (s *Server) auth(w http.ResponseWriter, r *http.Request) {
	cfg := s.e.Config()
	trust, peer := s.o.HTTP.Trust(cfg), httplimit.ParseAddr(r.RemoteAddr)
	if !trust.Trusts(peer) {
		writeProblem(w, http.StatusForbidden, "Forbidden",
			"forward-auth requests must come from a trusted proxy (trustedProxies in the rule file)", "")
		return
	}
	proxy := s.o.AuthProxy
	if proxy == "" {
		proxy = AuthNginx
	}
	f := proxy.read(r, trust.Proxies)
	if f.method == "" {
		f.method = http.MethodGet
	}
	if f.uri == "" {
		f.uri = "/"
	}
	u, err := url.ParseRequestURI(f.uri)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "Bad Request", "the forwarded URI does not parse", "uri")
		return
	}
	if f.host == "" {
		f.host = r.Host
	}
	if !f.client.IsValid() {
		// A proxy that sets the client header always has a client: without
		// one, count the proxy itself rather than no one.
		f.client = peer
	}
	req := rules.Request{
		Method: strings.ToUpper(f.method), Host: f.host, Path: u.EscapedPath(), RawQuery: u.RawQuery,
		Fragment: strings.IndexByte(f.uri, '#') >= 0,
		ClientIP: f.client, Header: r.Header, BodyUnseen: true, // the proxy sends no body
	}
	var res engine.Result
	s.limiter.Serve(&authExchange{s: s, w: w, r: r}, &req, &res)
}

// authExchange is forward-auth's side of the request pipeline: "forwarding"
// is answering 200, after which the proxy passes the request on. A delay
// (leaky-queue rules) holds the answer, so the proxy holds the request; a
// proxy that gives up gets the units back.
type authExchange struct {
	s *Server
	w http.ResponseWriter
	r *http.Request
}

func (x *authExchange) Context() context.Context { return x.r.Context() }

func (x *authExchange) Hold(d time.Duration) bool { return httplimit.Hold(x.r.Context(), d) }

func (x *authExchange) Abandon() { httplimit.Abandon(x.w) }

func (x *authExchange) Refuse(res *engine.Result) {
	x.s.limiter.Headers(x.w.Header(), res)
	httplimit.WriteProblem(x.w, httplimit.ProblemFor(res))
}

// Shed cannot happen: the service has no concurrency limit.
func (x *authExchange) Shed() {
	httplimit.WriteShed(x.w)
}

func (x *authExchange) Forward(path string, res *engine.Result, watch, keep bool) int {
	x.s.limiter.Headers(x.w.Header(), res)
	x.w.WriteHeader(http.StatusOK)
	return http.StatusOK
}

func (x *authExchange) ResponseHeader(string) string { return "" }
func (x *authExchange) ResponseBody() []byte         { return nil }
func (x *authExchange) SeesResponse() bool           { return false }
func (x *authExchange) TraceContext() (string, httplimit.HeaderCarrier) {
	return "auth", propagation.HeaderCarrier(x.r.Header)
}

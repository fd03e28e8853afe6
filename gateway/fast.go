package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/metrics"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/valyala/fasthttp"
)

// Fast is `sluice gateway`'s data plane on github.com/valyala/fasthttp:
// the request pipeline of httplimit (Limiter.Serve) on fasthttp's server and
// upstream client, which reuse their request and response objects, for
// about three times the requests per second of the net/http plane on the
// same cores (docs/benchmarks.md). It is an httplimit.Exchange and nothing
// more: every limit, delay, refund, permit, charge and settlement is the
// pipeline's, and the plane conformance suite (planes_test.go) runs the
// same cases against this plane and Handler (net/http).
//
// What it keeps of an HTTP/1.1 proxy: hop-by-hop headers (RFC 9110 §7.6.1,
// and those named in Connection) are dropped both ways; X-Forwarded-For is
// rebuilt (the chain received from a trusted proxy kept, the peer
// appended; a chain from anyone else dropped) with X-Forwarded-Host and
// -Proto; the client's Host is kept; request and response bodies of any
// size are streamed; an upgrade is tunnelled only once the upstream has
// switched protocols (see Upgrades); every upstream exchange has a timeout,
// and an unreachable or slow upstream gives 502 or 504 with a problem body.
// What it drops: HTTP/2 from clients (fasthttp serves HTTP/1.x; use
// Handler, --data-plane net/http, for HTTP/2).
type Fast struct {
	e        *engine.Engine
	limiter  *httplimit.Limiter
	upstream *url.URL
	client   *fasthttp.HostClient
	// whole reads responses whole, up to httplimit.MaxSettleBody, for the
	// requests a reserve rule settles from a JSON field of the response.
	whole    *fasthttp.HostClient
	conns    *upstreamConns // the connections both clients dial
	maxConns int
	timeout  time.Duration
	log      *slog.Logger
	metrics  *metrics.Metrics
	server   *fasthttp.Server
	pool     sync.Pool // of *fastState
	up       *upgrader
	// warnings are the upstream errors logged, at most one a second.
	warnings rareWarnings
}

type fastState struct {
	path   []byte // the request's path, escaped as net/http escapes it
	res    engine.Result
	req    rules.Request
	x      fastExchange
	header http.Header // the request headers rules read
	fwd    http.Header // the request's X-Forwarded-For and Forwarded lines, whatever the case of their names
	out    http.Header // the limit's response fields, for an upgrade
	body   []byte
	hop    hopScratch // the hop-by-hop removal's working memory
	// refusal is the last refusal written from this state, written again
	// while the refusals repeat.
	refusal httplimit.Refusal
}

// NewFast returns the fasthttp data plane for upstream.
func NewFast(upstream *url.URL, e *engine.Engine, o Options) *Fast {
	o.defaults()
	g := &Fast{
		e: e, limiter: httplimit.New(e, o.HTTP), upstream: upstream, timeout: o.Timeout,
		log: o.Logger, metrics: o.Metrics,
		up: newUpgrader(upstream, o), warnings: rareWarnings{log: o.Logger},
		conns:    &upstreamConns{idle: o.UpstreamIdle},
		maxConns: o.MaxConns,
		pool:     sync.Pool{New: func() any { return &fastState{header: http.Header{}, fwd: http.Header{}, out: http.Header{}} }},
	}
	// Two clients, one that streams answers and one that reads them whole
	// (to settle a cost from the body); both dial through g.conns, which
	// looks at a pooled connection before reusing it (see upstreamConns).
	// They have no ReadTimeout, and over plain HTTP no WriteTimeout: send
	// gives each exchange its deadline, which those would only repeat, at
	// two clock reads a request. Over TLS WriteTimeout stays: fasthttp
	// bounds a new connection's handshake by it alone, and without it an
	// upstream that never answers the handshake would hold the request,
	// and a connection slot, for good.
	g.client = &fasthttp.HostClient{
		Addr: hostPort(upstream), IsTLS: upstream.Scheme == "https", MaxConns: o.MaxConns,
		MaxIdleConnDuration: o.UpstreamIdle, DialTimeout: g.conns.dial, StreamResponseBody: true,
		DisablePathNormalizing: true, NoDefaultUserAgentHeader: true,
		DisableHeaderNamesNormalizing: true, TLSConfig: o.UpstreamTLS,
		MaxIdemponentCallAttempts: 1, // g.send decides what goes again
	}
	g.whole = &fasthttp.HostClient{
		Addr: g.client.Addr, IsTLS: g.client.IsTLS, MaxConns: o.MaxConns,
		MaxIdleConnDuration: o.UpstreamIdle, DialTimeout: g.conns.dial, MaxIdemponentCallAttempts: 1,
		MaxResponseBodySize: httplimit.MaxSettleBody, DisablePathNormalizing: true,
		NoDefaultUserAgentHeader: true, DisableHeaderNamesNormalizing: true, TLSConfig: o.UpstreamTLS,
	}
	if g.client.IsTLS {
		g.client.WriteTimeout, g.whole.WriteTimeout = o.Timeout, o.Timeout
	}
	g.server = &fasthttp.Server{
		Handler: g.serve, ErrorHandler: g.unreadable, Name: "sluice", StreamRequestBody: true, DisablePreParseMultipartForm: true,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ReadBufferSize: 64 << 10, NoDefaultServerHeader: true, NoDefaultDate: false,
		DisableHeaderNamesNormalizing: true, CloseOnShutdown: true, LazyRequestTime: true, // the plane never asks ctx.Time: no clock read for it a request
		Concurrency: clientConnections(o.MaxConns, g.up.MaxTunnels),
	}
	return g
}

// clientConnections is how many client connections the fasthttp plane
// serves at once: what the open-file limit leaves once the upstream's
// connections (two clients of maxConns each) and the tunnels (two
// descriptors each) have theirs, and a margin. Beyond it fasthttp answers
// new connections 503 and closes them; the process never runs out of
// descriptors on client connections alone (patient.Listener waits out the
// rest).
func clientConnections(maxConns, maxTunnels int) int {
	n := fileLimit()
	if n <= 0 {
		return 0 // fasthttp's default
	}
	return max(64, n-2*maxConns-2*maxTunnels-256)
}

func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return u.Host + ":443"
	}
	return u.Host + ":80"
}

// Serve serves on ln until Shutdown. Its plain TCP connections arm their
// deadlines lazily (lazyConn).
func (g *Fast) Serve(ln net.Listener) error { return g.server.Serve(lazyListener{ln}) }

// Shutdown stops accepting, then waits for the requests in flight, or
// until ctx ends.
func (g *Fast) Shutdown(ctx context.Context) error { return g.server.ShutdownWithContext(ctx) }

// Protocols are what the plane speaks: fasthttp serves HTTP/1.x only.
func (g *Fast) Protocols() []string { return []string{"http/1.1"} }

func (g *Fast) serve(ctx *fasthttp.RequestCtx) {
	defer func() {
		if v := recover(); v != nil {
			g.metrics.Panicked(g.log, metrics.HTTP, v, "method", string(ctx.Method()), "path", string(ctx.Path()))
			g.problem(ctx, http.StatusInternalServerError, "Internal Server Error", "sluice could not answer this request")
		}
	}()
	st := g.pool.Get().(*fastState)
	defer g.pool.Put(st)
	cfg := g.e.Config()
	trust, peer := g.limiter.Trust(cfg), remoteAddr(ctx)
	clear(st.header)
	clear(st.fwd)
	// Only the headers the rules can read, and the forwarding ones, are
	// copied out: the request's own stay in fasthttp's buffers. Names are
	// kept as sent (DisableHeaderNamesNormalizing), so they are compared in
	// canonical form: "x-forwarded-for" is X-Forwarded-For.
	reads := cfg.HeaderNames()
	for k, v := range ctx.Request.Header.All() {
		if ck, ok := canonicalIn(k, reads); ok {
			st.header[ck] = append(st.header[ck], string(v))
		}
		if ck, ok := canonicalIn(k, forwardingFields); ok {
			st.fwd[ck] = append(st.fwd[ck], string(v))
		}
	}
	client := trust.Client(peer, st.fwd)
	uri := ctx.Request.URI()
	st.path = appendEscapedPath(st.path[:0], uri.PathOriginal())
	st.req = rules.Request{
		Method: view.String(ctx.Method()), Host: view.String(ctx.Host()), Path: view.String(st.path), RawQuery: view.String(uri.QueryString()),
		Fragment: bytes.IndexByte(ctx.Request.Header.RequestURI(), '#') >= 0,
		ClientIP: client, Header: st.header,
	}
	if cfg.NeedsBody() {
		st.req.Body, st.req.BodyTruncated = g.peekBody(ctx)
	}
	st.x = fastExchange{g: g, ctx: ctx, st: st, peer: peer, fromTrusted: trust.Trusts(peer)}
	g.limiter.Serve(&st.x, &st.req, &st.res)
	st.req, st.x = rules.Request{}, fastExchange{} // drop the request's references before pooling
}

// forwardingFields are the request fields a trusted proxy names the client
// in.
var forwardingFields = []string{"X-Forwarded-For", "Forwarded"}

// canonicalIn returns the one of names, all canonical, that the field name
// k is in canonical form (http.CanonicalHeaderKey), if any. It compares
// lengths and ASCII letters first: a request's other fields, most of them,
// cost no canonical form.
func canonicalIn(k []byte, names []string) (string, bool) {
	for _, n := range names {
		if len(n) == len(k) && asciiFold(k, n) && http.CanonicalHeaderKey(view.String(k)) == n {
			return n, true
		}
	}
	return "", false
}

// asciiFold reports whether a and b are equal but for the case of ASCII
// letters (never Unicode's folds: a field name is ASCII).
func asciiFold(a []byte, b string) bool {
	for i := range a {
		x, y := a[i], b[i]
		if x != y && (x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z') {
			return false
		}
	}
	return true
}

// peekBody returns up to rules.MaxBodyBytes of a body for body key sources,
// leaving the body whole for the upstream, and whether the body is longer.
func (g *Fast) peekBody(ctx *fasthttp.RequestCtx) ([]byte, bool) {
	if s := ctx.RequestBodyStream(); s != nil {
		buf := make([]byte, rules.MaxBodyBytes+1) // one byte more, to know
		n, _ := io.ReadFull(s, buf)
		buf = buf[:n]
		// Forwarded with the length the client declared, if it did: an
		// upstream that refuses chunked requests still takes it.
		ctx.Request.SetBodyStream(io.MultiReader(strings.NewReader(string(buf)), s), max(ctx.Request.Header.ContentLength(), -1))
		return buf[:min(n, rules.MaxBodyBytes)], n > rules.MaxBodyBytes
	}
	body := ctx.Request.Body()
	return body[:min(len(body), rules.MaxBodyBytes)], len(body) > rules.MaxBodyBytes
}

// reject answers a refused request without touching the upstream: the
// limit's fields and the problem body, written straight into the response.
// A refusal like the last one written from st is written again as it was
// rendered (httplimit.Refusal): under a flood most refusals repeat, and
// rendering is most of the limiter's work on this path.
func (g *Fast) reject(ctx *fasthttp.RequestCtx, res *engine.Result, st *fastState) {
	r := &st.refusal
	r.Render(g.limiter, res)
	for i := range r.Fields() {
		name, v := r.Field(i)
		ctx.Response.Header.AddBytesV(name, v) // copied in
	}
	ctx.SetStatusCode(r.Status())
	ctx.SetContentType("application/problem+json")
	ctx.SetBody(r.Body()) // copied into the response
}

// unreadable answers a request fasthttp could not read, as net/http's
// server does: 431 for a header too large, 408 for one too slow, 501 for
// a transfer coding it does not know (RFC 9112 section 6.1), 400
// otherwise; with a problem body, and the connection closed.
func (g *Fast) unreadable(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var op *net.OpError
	switch {
	case errors.As(err, &small):
		g.problem(ctx, http.StatusRequestHeaderFieldsTooLarge, "Request Header Fields Too Large", "the request's header is too large")
	case errors.As(err, &op) && op.Timeout():
		g.problem(ctx, http.StatusRequestTimeout, "Request Timeout", "the request was not sent in time")
	case strings.Contains(err.Error(), "unsupported transfer-encoding"):
		g.problem(ctx, http.StatusNotImplemented, "Not Implemented", "the request's transfer coding is not one this server knows")
	default:
		g.problem(ctx, http.StatusBadRequest, "Bad Request", "the request could not be read")
	}
}

// upstreamFailed answers a failed upstream exchange (upstreamFailure).
func (g *Fast) upstreamFailed(ctx *fasthttp.RequestCtx, err error) {
	p, logged := upstreamFailure(err)
	if logged {
		g.warnings.warn("sluice: upstream unreachable", "upstream", g.upstream.Host, "error", err)
	}
	g.problem(ctx, p.Status, p.Title, p.Detail)
}

func (g *Fast) problem(ctx *fasthttp.RequestCtx, status int, title, detail string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/problem+json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(httplimit.AppendProblem(nil, &httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail}))
}

// send sends req upstream within the gateway's timeout. A request that met
// a pooled connection the upstream had closed goes again, on the next
// pooled connection or a new one (each failed one is closed, so this ends):
// one found stale before a byte was written, always; one written as the
// upstream closed, if it may be sent twice and no new connection failed
// meanwhile (see upstreamConns). Any other failure is the answer.
func (g *Fast) send(client *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) error {
	deadline := time.Now().Add(g.timeout)
	for tries := 0; ; tries++ {
		fresh := g.conns.freshFailed.Load()
		err := client.DoDeadline(req, resp, deadline)
		switch {
		case err == nil || tries >= g.maxConns:
			return err
		case errors.Is(err, errStaleConn):
		case !unanswered(err) || !resendable(req) || g.conns.freshFailed.Load() != fresh:
			return err
		}
	}
}

// forward sends an admitted request to the upstream and its answer back.
func (g *Fast) forward(ctx *fasthttp.RequestCtx, peer netip.Addr, fromTrusted bool, path string, res *engine.Result, st *fastState, whole bool) {
	req := &ctx.Request
	// The forwarding fields are rebuilt: any the client sent go, whatever
	// the case of their names, and so do the other fields naming a client
	// address unless a trusted proxy sent them.
	drop := forwardingHeaders
	if !fromTrusted {
		drop = untrustedHeaders
	}
	hop := scrubRequestHop(&req.Header, &st.hop, drop...)
	asked := ""
	if hop.connUpgrade {
		asked = hop.upgrade
	}
	if hop.trailers {
		req.Header.Set("Te", "trailers") // the one TE value passed on, as httputil.ReverseProxy does
	}
	// X-Forwarded-For: keep a trusted proxy's chain, drop anyone else's.
	var buf [64]byte
	xff := buf[:0]
	if chain := st.fwd["X-Forwarded-For"]; len(chain) > 0 && fromTrusted {
		for _, c := range chain {
			xff = append(append(xff, c...), ", "...)
		}
	}
	req.Header.SetBytesV("X-Forwarded-For", peer.AppendTo(xff))
	req.Header.SetBytesV("X-Forwarded-Host", ctx.Host())
	if client := st.req.ClientIP; client.IsValid() {
		req.Header.SetBytesV("X-Real-IP", client.AppendTo(buf[:0]))
	}
	proto := "http"
	if ctx.IsTLS() {
		proto = "https"
	}
	req.Header.Set("X-Forwarded-Proto", proto)
	// What was limited is what is served: the normalised path.
	if path != view.String(req.URI().PathOriginal()) {
		if q := req.URI().QueryString(); len(q) > 0 {
			req.SetRequestURI(path + "?" + string(q))
		} else {
			req.SetRequestURI(path)
		}
	}
	req.URI().SetScheme(g.upstream.Scheme)
	// As net/http's proxy: a request without a Host (HTTP/1.0) goes with
	// the upstream's, and a body without a type goes without one.
	if len(req.Header.Host()) == 0 {
		req.Header.SetHost(g.upstream.Host)
	}
	req.Header.SetNoDefaultContentType(true)
	if asked != "" {
		clear(st.out)
		g.limiter.Headers(st.out, res)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", asked)
		g.upgrade(ctx, st, asked)
		return
	}
	client := g.client
	if whole {
		client = g.whole
	}
	if err := g.send(client, req, &ctx.Response); err != nil {
		g.upstreamFailed(ctx, err)
		return
	}
	// The status line is the gateway's own (HTTP/1.1 and the standard
	// reason phrase), not the upstream's: an HTTP/1.0 upstream must not
	// make an HTTP/1.1 client read "HTTP/1.0".
	if ka := ctx.Response.Header.Peek("Keep-Alive"); len(ka) > 0 {
		g.conns.announce(ka)
	}
	ctx.Response.Header.SetProtocol(nil)
	ctx.Response.Header.SetStatusMessage(nil)
	scrubResponseHop(&ctx.Response.Header, &st.hop)
	h := &ctx.Response.Header
	g.limiter.VisitHeaders(res, func(name string, v []byte) { h.SetBytesV(name, v) })
}

// forwardingHeaders are the fields the gateway rebuilds for the upstream;
// untrustedHeaders those it also drops when the peer is not a trusted
// proxy: every field an upstream might take a client's address or the
// original request from (see clientAddressHeaders).
var (
	forwardingHeaders = []string{"X-Forwarded-For", "Forwarded", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip"}
	untrustedHeaders  = append(slices.Clone(forwardingHeaders), clientAddressHeaders...)
)

func remoteAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

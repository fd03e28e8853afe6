package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sluice-rl/sluice/concurrency"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/valyala/fasthttp"
)

// FastGateway is `sluice gateway`'s data plane on github.com/valyala/fasthttp:
// the same limiting as Gateway (the net/http middleware and
// httputil.ReverseProxy), on a server and an upstream client that reuse
// their request and response objects, for about twice the requests per
// second of the net/http path on the same cores (docs/benchmarks.md). The
// library middleware stays net/http; only this proxy is fasthttp.
//
// What it keeps of an HTTP/1.1 proxy: hop-by-hop headers (RFC 9110 §7.6.1,
// and those named in Connection) are dropped both ways; X-Forwarded-For is
// rebuilt (the chain received from a trusted proxy kept, the peer
// appended; a chain from anyone else dropped) with X-Forwarded-Host and
// -Proto; request and response bodies of any size are streamed; an Upgrade
// (WebSocket) is tunnelled after the limit check; every upstream exchange
// has a timeout, and an unreachable or slow upstream gives 502 or 504 with
// a problem body. What it drops: HTTP/2 from clients (fasthttp serves
// HTTP/1.x; use Gateway, --data-plane net/http, for HTTP/2).
type FastGateway struct {
	e        *engine.Engine
	limiter  *httplimit.Limiter
	o        httplimit.Options
	upstream *url.URL
	client   *fasthttp.HostClient
	// whole reads responses whole, up to httplimit.MaxSettleBody, for the
	// requests a reserve rule settles from a JSON field of the response.
	whole   *fasthttp.HostClient
	timeout time.Duration
	log     *slog.Logger
	panics  *panics
	server  *fasthttp.Server
	pool    sync.Pool // of *fastState

	concurrency *concurrency.Limiter // nil: no bound on what is in flight
	pressure    *concurrency.Pressure
}

// FastOptions configure a FastGateway.
type FastOptions struct {
	HTTP    httplimit.Options
	Logger  *slog.Logger
	Metrics *Metrics
	// MaxConns bounds the connections to the upstream (default 1024).
	MaxConns int
	// Timeout bounds one upstream exchange (default 30 s).
	Timeout time.Duration
	// Concurrency, if set, bounds the requests in flight to the upstream
	// (see httplimit.Options.Concurrency): beyond it, 503 at once.
	Concurrency *concurrency.Limiter
	// Pressure, if set, is told each upstream answer's latency and whether
	// it failed (a 5xx, an unreachable or slow upstream, or a request the
	// concurrency limit shed): see httplimit.Options.Pressure.
	Pressure *concurrency.Pressure
}

type fastState struct {
	res     engine.Result
	req     rules.Request
	header  http.Header // the request headers rules read
	out     http.Header // the limit's response fields
	body    []byte
	problem httplimit.Problem // a refusal's body, before it is written out

	// The last refusal written from this state, kept to be written again
	// while the refusals repeat (httplimit.RefusalKey): its fields (names,
	// and values in vals), status and body.
	refused  bool
	key      httplimit.RefusalKey
	fields   []renderedField
	vals     []byte
	status   int
	refusals []byte
}

type renderedField struct {
	name       string
	start, end int // its value in vals
}

// NewFastGateway returns the fasthttp data plane for upstream.
func NewFastGateway(upstream *url.URL, e *engine.Engine, o FastOptions) *FastGateway {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics("")
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1024
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	g := &FastGateway{
		e: e, o: o.HTTP, limiter: httplimit.New(e, o.HTTP), upstream: upstream, timeout: o.Timeout, concurrency: o.Concurrency, pressure: o.Pressure,
		log: o.Logger, panics: &o.Metrics.panics,
		client: &fasthttp.HostClient{
			Addr: hostPort(upstream), IsTLS: upstream.Scheme == "https", MaxConns: o.MaxConns,
			ReadTimeout: o.Timeout, WriteTimeout: o.Timeout, MaxIdleConnDuration: 90 * time.Second,
			StreamResponseBody: true, DisablePathNormalizing: true, NoDefaultUserAgentHeader: true,
			DisableHeaderNamesNormalizing: true,
		},
		pool: sync.Pool{New: func() any { return &fastState{header: http.Header{}, out: http.Header{}} }},
	}
	g.whole = &fasthttp.HostClient{
		Addr: g.client.Addr, IsTLS: g.client.IsTLS, MaxConns: o.MaxConns,
		ReadTimeout: o.Timeout, WriteTimeout: o.Timeout, MaxIdleConnDuration: 90 * time.Second,
		MaxResponseBodySize: httplimit.MaxSettleBody, DisablePathNormalizing: true,
		NoDefaultUserAgentHeader: true, DisableHeaderNamesNormalizing: true,
	}
	g.server = &fasthttp.Server{
		Handler: g.serve, Name: "sluice", StreamRequestBody: true, DisablePreParseMultipartForm: true,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ReadBufferSize: 64 << 10, NoDefaultServerHeader: true, NoDefaultDate: false,
		DisableHeaderNamesNormalizing: true, CloseOnShutdown: true,
	}
	return g
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

// Serve serves on ln until Shutdown.
func (g *FastGateway) Serve(ln net.Listener) error { return g.server.Serve(ln) }

// Shutdown stops accepting, waits for requests in flight, then returns.
func (g *FastGateway) Shutdown() error { return g.server.Shutdown() }

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (with the
// obsolete Keep-Alive and Proxy-Connection), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func b2s(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func (g *FastGateway) serve(ctx *fasthttp.RequestCtx) {
	defer func() {
		if v := recover(); v != nil {
			g.panics.http.Add(1)
			g.log.Error("sluice: recovered from a panic while serving a request", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			g.problem(ctx, http.StatusInternalServerError, "Internal Server Error", "sluice could not answer this request")
		}
	}()
	st := g.pool.Get().(*fastState)
	defer g.pool.Put(st)
	cfg := g.e.Config()
	trusted := g.o.TrustedProxies
	if trusted == nil {
		trusted = cfg.TrustedProxies
	}
	peer := remoteAddr(ctx)
	clear(st.header)
	// Only the headers the rules can read are copied out: the request's
	// own stay in fasthttp's buffers.
	ctx.Request.Header.VisitAll(func(k, v []byte) {
		ck := http.CanonicalHeaderKey(b2s(k))
		if cfg.ReadsHeader(ck) {
			st.header[ck] = append(st.header[ck], string(v))
		}
	})
	chain := ctx.Request.Header.Peek("X-Forwarded-For")
	fwd := ctx.Request.Header.Peek("Forwarded")
	client := peer
	if peer.IsValid() && containsAddr(trusted, peer) && (len(chain) > 0 || len(fwd) > 0) {
		h := http.Header{}
		if len(chain) > 0 {
			h["X-Forwarded-For"] = []string{string(chain)}
		}
		if len(fwd) > 0 {
			h["Forwarded"] = []string{string(fwd)}
		}
		client = httplimit.ClientIPAtDepth(&http.Request{RemoteAddr: netip.AddrPortFrom(peer, 1).String(), Header: h}, trusted, cfg.ClientIPDepth)
	}
	uri := ctx.Request.URI()
	st.req = rules.Request{
		Method: b2s(ctx.Method()), Host: b2s(ctx.Host()), Path: b2s(uri.PathOriginal()), RawQuery: b2s(uri.QueryString()),
		ClientIP: client, Header: st.header,
	}
	if cfg.NeedsBody() {
		st.req.Body = g.peekBody(ctx)
	}
	res := &st.res
	g.e.Check(ctx, &st.req, engine.CheckOptions{Reserve: cfg.SettlesFromResponses()}, res)
	path := st.req.Path
	st.req = rules.Request{}
	if !res.Allowed {
		g.reject(ctx, res, st)
		return
	}
	if res.Delay > 0 {
		if res.Delay > g.limiter.MaxDelay() {
			g.e.Refund(ctx, res)
			res.Allowed, res.Decision.Allowed = false, false
			res.Decision.RetryAfter = res.Delay - g.limiter.MaxDelay()
			g.reject(ctx, res, st)
			return
		}
		time.Sleep(res.Delay)
	}
	if g.pressure != nil {
		start := time.Now()
		defer func() { g.pressure.Observe(time.Since(start), ctx.Response.StatusCode() >= 500) }()
	}
	if c := g.concurrency; c != nil {
		p, err := c.AcquireAt(ctx, res.Tier())
		if err != nil {
			p := httplimit.ShedProblem()
			st.body = appendProblem(st.body[:0], p)
			ctx.SetStatusCode(p.Status)
			ctx.SetContentType("application/problem+json")
			ctx.Response.Header.Set("Retry-After", "1")
			ctx.Response.Header.Set("Cache-Control", "no-store")
			ctx.SetBody(st.body)
			return
		}
		defer func() {
			if ctx.Response.StatusCode() >= 500 {
				p.Release(concurrency.Dropped)
			} else {
				p.Release(concurrency.Success)
			}
		}()
	}
	whole := res.Settles() && cfg.SettlesFromJSON()
	g.forward(ctx, peer, trusted, path, res, st, whole)
	g.afterResponse(ctx, res, whole)
}

// afterResponse charges the countOn rules for the response's status and
// settles the reservations from its header or JSON body (read whole by
// forward when whole is set; otherwise the estimate stands for a JSON
// field). The response is already complete here: both run before it is
// written to the client, and neither delays it beyond one store call.
func (g *FastGateway) afterResponse(ctx *fasthttp.RequestCtx, res *engine.Result, whole bool) {
	if !res.Charges() && !res.Settles() {
		return
	}
	var body []byte
	if whole && !ctx.Response.IsBodyStream() {
		body = ctx.Response.Body()
	}
	header := func(k string) string { return string(ctx.Response.Header.Peek(k)) }
	httplimit.Finish(ctx, g.e, res, ctx.Response.StatusCode(), header, body)
}

// peekBody returns up to rules.MaxBodyBytes of a body for body key sources,
// leaving the body whole for the upstream.
func (g *FastGateway) peekBody(ctx *fasthttp.RequestCtx) []byte {
	if s := ctx.RequestBodyStream(); s != nil {
		buf := make([]byte, rules.MaxBodyBytes)
		n, _ := io.ReadFull(s, buf)
		buf = buf[:n]
		ctx.Request.SetBodyStream(io.MultiReader(strings.NewReader(string(buf)), s), -1)
		return buf
	}
	body := ctx.Request.Body()
	return body[:min(len(body), rules.MaxBodyBytes)]
}

// reject answers a refused request without touching the upstream: the
// limit's fields and the problem body, written straight into the response.
//
// A refusal like the last one written from st (the same RefusalKey) is
// written again as it was rendered: under a flood most refusals repeat, and
// rendering is most of the limiter's work on this path.
func (g *FastGateway) reject(ctx *fasthttp.RequestCtx, res *engine.Result, st *fastState) {
	var k httplimit.RefusalKey
	keyed := g.limiter.RefusalKey(res, &k)
	if !keyed || !st.refused || k != st.key {
		g.render(res, st)
		st.refused, st.key = keyed, k
	}
	for _, f := range st.fields {
		ctx.Response.Header.AddBytesV(f.name, st.vals[f.start:f.end]) // copied in
	}
	ctx.SetStatusCode(st.status)
	ctx.SetContentType("application/problem+json")
	ctx.SetBody(st.refusals) // copied into the response
}

// render writes a refusal's fields, status and problem body into st.
func (g *FastGateway) render(res *engine.Result, st *fastState) {
	st.fields, st.vals = st.fields[:0], st.vals[:0]
	g.limiter.VisitHeaders(res, func(name string, v []byte) {
		st.fields = append(st.fields, renderedField{name: name, start: len(st.vals), end: len(st.vals) + len(v)})
		st.vals = append(st.vals, v...)
	})
	p := &st.problem
	httplimit.FillProblem(p, res)
	st.refusals = appendProblem(st.refusals[:0], p)
	st.status = p.Status
}

// appendProblem appends p as JSON, as encoding/json would write it.
func appendProblem(b []byte, p *httplimit.Problem) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, p.Detail)
	if len(p.ViolatedPolicies) > 0 {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range p.ViolatedPolicies {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

// appendJSONString appends s as a JSON string, escaped as json.Marshal
// escapes it (HTML characters and U+2028/U+2029 included).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0 // s[start:i] needs no escaping: it is copied in one append
	for i := 0; i < len(s); i++ {
		c := s[i]
		if jsonPlain[c] {
			continue
		}
		if c == 0xe2 && !(i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xa8 || s[i+2] == 0xa9)) {
			continue // another three-byte character: copied as it is
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case 0xe2: // U+2028 and U+2029 are E2 80 A8 and E2 80 A9
			b = append(b, '\\', 'u', '2', '0', '2', hex[s[i+2]&15])
			i += 2
		default: // control characters and the HTML ones
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonPlain marks the bytes appendJSONString copies as they are: not a
// control character, a quote, a backslash, an HTML character, or 0xE2 (the
// first byte of U+2028 and U+2029, and of other characters, checked apart).
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = !strings.ContainsRune(`"\<>&`, rune(c)) && c != 0xe2
	}
	return t
}()

func (g *FastGateway) problem(ctx *fasthttp.RequestCtx, status int, title, detail string) {
	ctx.Response.Reset()
	body, _ := json.Marshal(problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/problem+json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(append(body, '\n'))
}

// forward sends an admitted request to the upstream and its answer back.
func (g *FastGateway) forward(ctx *fasthttp.RequestCtx, peer netip.Addr, trusted []netip.Prefix, path string, res *engine.Result, st *fastState, whole bool) {
	req := &ctx.Request
	upgrade := isUpgrade(&req.Header)
	upgradeTo := string(req.Header.Peek("Upgrade"))
	dropHop(&req.Header)
	// X-Forwarded-*: keep a trusted proxy's chain, drop anyone else's.
	prior := ""
	if peer.IsValid() && containsAddr(trusted, peer) {
		prior = string(req.Header.Peek("X-Forwarded-For"))
	}
	xff := peer.String()
	if prior != "" {
		xff = prior + ", " + xff
	}
	req.Header.Set("X-Forwarded-For", xff)
	req.Header.Set("X-Forwarded-Host", string(ctx.Host()))
	proto := "http"
	if ctx.IsTLS() {
		proto = "https"
	}
	req.Header.Set("X-Forwarded-Proto", proto)
	// What was limited is what is served: the normalised path.
	if q := req.URI().QueryString(); len(q) > 0 {
		req.SetRequestURI(path + "?" + string(q))
	} else {
		req.SetRequestURI(path)
	}
	req.URI().SetScheme(g.upstream.Scheme)
	req.SetHost(g.upstream.Host)
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", upgradeTo)
		g.tunnel(ctx)
		return
	}
	clear(st.out)
	g.limiter.Headers(st.out, res)
	client := g.client
	if whole {
		client = g.whole
	}
	err := client.DoTimeout(req, &ctx.Response, g.timeout)
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		g.problem(ctx, http.StatusBadGateway, "Bad Gateway", fmt.Sprintf("the upstream's answer is larger than the %d bytes read to settle its cost", httplimit.MaxSettleBody))
		return
	case errors.Is(err, fasthttp.ErrTimeout):
		g.problem(ctx, http.StatusGatewayTimeout, "Gateway Timeout", "the upstream service did not answer in time")
		return
	case err != nil:
		g.log.Warn("sluice: upstream unreachable", "upstream", g.upstream.Host, "error", err)
		g.problem(ctx, http.StatusBadGateway, "Bad Gateway", "the upstream service did not answer")
		return
	}
	dropHop(&ctx.Response.Header)
	for k, vs := range st.out {
		for _, v := range vs {
			ctx.Response.Header.Set(k, v)
		}
	}
}

type headerish interface {
	Peek(string) []byte
	Del(string)
}

func isUpgrade(h *fasthttp.RequestHeader) bool {
	return len(h.Peek("Upgrade")) > 0 && strings.Contains(strings.ToLower(string(h.Peek("Connection"))), "upgrade")
}

// dropHop removes the hop-by-hop headers, and those Connection names.
func dropHop(h headerish) {
	for f := range strings.SplitSeq(string(h.Peek("Connection")), ",") {
		if f = strings.TrimSpace(f); f != "" {
			h.Del(f)
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// tunnel passes an Upgrade (WebSocket) to the upstream and then copies
// bytes both ways until either side closes.
func (g *FastGateway) tunnel(ctx *fasthttp.RequestCtx) {
	up, err := net.DialTimeout("tcp", hostPort(g.upstream), 5*time.Second)
	if err != nil {
		g.problem(ctx, http.StatusBadGateway, "Bad Gateway", "the upstream service did not answer")
		return
	}
	up.SetDeadline(time.Now().Add(g.timeout))
	w := bufio.NewWriter(up)
	if err := ctx.Request.Write(w); err != nil || w.Flush() != nil {
		up.Close()
		g.problem(ctx, http.StatusBadGateway, "Bad Gateway", "the upstream service did not take the upgrade")
		return
	}
	up.SetDeadline(time.Time{})
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer up.Close()
		done := make(chan struct{}, 2)
		go func() { io.Copy(up, c); done <- struct{}{} }()
		go func() { io.Copy(c, up); done <- struct{}{} }()
		<-done
	})
}

func remoteAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

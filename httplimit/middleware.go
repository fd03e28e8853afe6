package httplimit

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/concurrency"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
)

// HeaderMode says when allowed responses carry the RateLimit fields.
type HeaderMode uint8

// The header modes.
const (
	// HeadersAlways sends RateLimit-Policy and RateLimit on every allowed
	// response (the default), so clients can slow down early.
	HeadersAlways HeaderMode = iota
	// HeadersNearLimit sends them only when the tightest rule has at most
	// NearLimit of its quota left.
	HeadersNearLimit
	// HeadersNever sends them on rejections only.
	HeadersNever
)

// Options configure the middleware.
type Options struct {
	// AllowedHeaders says when allowed responses carry RateLimit fields.
	AllowedHeaders HeaderMode
	// NearLimit is the share of a rule's quota under which HeadersNearLimit
	// starts sending headers (default 0.2).
	NearLimit float64
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the key is back to full), on every
	// response that carries RateLimit fields.
	LegacyHeaders bool
	// Jitter adds up to this much, at random, to Retry-After, so rejected
	// clients do not all come back at once. Retry-After never points
	// earlier than the RateLimit field's t.
	Jitter time.Duration
	// MaxDelay is the longest a leaky-queue rule may hold a request
	// (default 10s); a longer delay is refused with 429 and its units given
	// back.
	MaxDelay time.Duration
	// TrustedProxies are the peers whose forwarding headers are believed.
	// Default: the rule file's trustedProxies.
	TrustedProxies []netip.Prefix
	// RewritePath makes the request that next sees carry the normalised path
	// the rules matched (see rules.PathOptions), so that what was limited is
	// what is served: "//otp" and "/%6Ftp" reach next as "/otp". The
	// gateway sets it; a library user whose router reads paths some other
	// way may leave it off.
	RewritePath bool
	// OnReject, if set, writes the rejection instead of the problem+json
	// body. Retry-After and the RateLimit fields are already set.
	OnReject func(w http.ResponseWriter, r *http.Request, res *engine.Result)
	// Concurrency, if set, also bounds the requests in flight to next: a
	// request the rules admit takes a permit, or is answered 503
	// (temporary-reduced-capacity) at once. Its latency and outcome move
	// an adaptive limit: a 5xx answer counts as dropped.
	Concurrency *concurrency.Limiter
	// Pressure, if set, is told how long each admitted request took in
	// next and whether it failed (a 5xx, or shed by Concurrency): the
	// signal that the engine's adaptive rules follow (engine.Options.Pressure
	// set to its Factor).
	Pressure *concurrency.Pressure
	// Tracer, if set, makes a span of each decision, parented to the
	// request's trace context (package tracing's, for OpenTelemetry).
	Tracer Tracer
	// TraceVia is the sluice.via of those spans (default "http").
	TraceVia string
	// LogVia is the via of the decision log's lines (default "http"), and
	// LogPath gives them the request's path: for faces whose paths name a
	// fixed set of operations (grpclimit: "grpc" and the method).
	LogVia  string
	LogPath bool
}

// Limiter is the middleware: an http.Handler wrapper built from an engine.
type Limiter struct {
	e        *engine.Engine
	o        Options
	pool     sync.Pool // of *state
	policies policyCache
}

type state struct {
	res engine.Result
	req rules.Request
	buf []byte
	x   httpExchange
}

// New returns the middleware for e.
func New(e *engine.Engine, o Options) *Limiter {
	if o.NearLimit <= 0 {
		o.NearLimit = 0.2
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = 10 * time.Second
	}
	return &Limiter{e: e, o: o, pool: sync.Pool{New: func() any { return new(state) }}}
}

// MaxDelay is the longest a leaky-queue rule may hold a request.
func (l *Limiter) MaxDelay() time.Duration { return l.o.MaxDelay }

// Middleware returns New(e, o).Handler, the func(http.Handler) http.Handler
// form routers expect.
func Middleware(e *engine.Engine, o Options) func(http.Handler) http.Handler {
	return New(e, o).Handler
}

// Handler wraps next: each request is checked before next sees it.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.serve(w, r, next)
	})
}

func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	st := l.pool.Get().(*state)
	defer l.pool.Put(st)
	cfg := l.e.Config()
	st.req = rules.Request{
		Method: r.Method, Host: r.Host, Path: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
		Fragment: strings.IndexByte(r.RequestURI, '#') >= 0,
		ClientIP: l.o.Trust(cfg).Client(parseHost(r.RemoteAddr), r.Header), Header: r.Header,
	}
	if cfg.NeedsBody() && r.Body != nil && r.Body != http.NoBody {
		st.req.Body, st.req.BodyTruncated = readBody(r)
	}
	st.x = httpExchange{l: l, w: w, r: r, next: next, st: st}
	l.Serve(&st.x, &st.req, &st.res)
	// Drop the request's references before pooling.
	st.req, st.x = rules.Request{}, httpExchange{}
}

// httpExchange is the middleware's side of the pipeline: a net/http request
// and the handler it protects.
type httpExchange struct {
	l    *Limiter
	w    http.ResponseWriter
	r    *http.Request
	next http.Handler
	st   *state
	sw   *statusWriter // the writer next wrote through, when watched
}

func (x *httpExchange) Context() context.Context { return x.r.Context() }

func (x *httpExchange) Hold(d time.Duration) bool { return Hold(x.r.Context(), d) }

func (x *httpExchange) SeesResponse() bool { return true }

func (x *httpExchange) TraceContext() (string, HeaderCarrier) {
	via := x.l.o.TraceVia
	if via == "" {
		via = "http"
	}
	return via, headerCarrier(x.r.Header)
}

func (x *httpExchange) Abandon() { Abandon(x.w) }

func (x *httpExchange) Refuse(res *engine.Result) { x.l.reject(x.w, x.r, res, x.st) }

func (x *httpExchange) Shed() { WriteShed(x.w) }

func (x *httpExchange) Forward(path string, res *engine.Result, watch, keep bool) int {
	l, w, r := x.l, x.w, x.r
	if l.o.RewritePath && path != r.URL.EscapedPath() {
		setPath(r.URL, path) // serve what was limited
	}
	if l.sendAllowedHeaders(res) {
		x.st.buf = setHeaders(w.Header(), res, l.o.LegacyHeaders, 0, x.st.buf, &l.policies)
	}
	if !watch {
		x.next.ServeHTTP(w, r)
		return 0
	}
	// One writer remembers the status (and, with keep, the body) for all
	// that reads it after the handler. Only then is w wrapped: a handler
	// that asserts w to http.Flusher or http.Hijacker sees the server's
	// own writer otherwise.
	x.sw = &statusWriter{ResponseWriter: w, keep: keep} // not pooled: a handler may keep w past its return
	x.next.ServeHTTP(x.sw, r)
	return x.sw.status
}

func (x *httpExchange) ResponseHeader(name string) string { return x.sw.Header().Get(name) }

func (x *httpExchange) ResponseBody() []byte {
	if x.sw == nil || !x.sw.keep {
		return nil
	}
	return x.sw.body
}

// setPath sets u's path to p, a normalised escaped path.
func setPath(u *url.URL, p string) {
	dec, err := url.PathUnescape(p)
	if err != nil {
		return // cannot happen: p's escapes are all well formed or kept as data
	}
	u.Path, u.RawPath = dec, p
}

func (l *Limiter) sendAllowedHeaders(res *engine.Result) bool {
	switch l.o.AllowedHeaders {
	case HeadersNever:
		return false
	case HeadersNearLimit:
		d := &res.Decision
		return d.Rule != "" && float64(d.Remaining) <= l.o.NearLimit*float64(d.Limit.Capacity())
	}
	return res.Decision.Rule != ""
}

// reject writes the refusal: headers by the book, then the problem (or the
// caller's OnReject).
func (l *Limiter) reject(w http.ResponseWriter, r *http.Request, res *engine.Result, st *state) {
	st.buf = l.rejectHeaders(w.Header(), res, st.buf)
	if l.o.OnReject != nil {
		l.o.OnReject(w, r, res)
		return
	}
	WriteProblem(w, ProblemFor(res))
}

func (l *Limiter) rejectHeaders(h http.Header, res *engine.Result, buf []byte) []byte {
	return l.visitRejectFields(func(name string, v []byte) { h[name] = []string{fieldString(name, v, &l.policies)} }, res, buf)
}

// visitRejectFields is visitFields for a refusal: Retry-After, the RateLimit
// fields, and Cache-Control.
func (l *Limiter) visitRejectFields(set func(name string, value []byte), res *engine.Result, buf []byte) []byte {
	d := &res.Decision
	if d.Reason == sluice.ReasonMissingKey || d.Reason == sluice.ReasonBadRequest {
		// A 400 (or 413, 415) is no quota's answer: RateLimit fields (a
		// policy, "r=0") would tell a client to wait for a quota it never
		// used, and no wait makes the request countable.
		set("Cache-Control", noStore)
		return buf
	}
	var t int64
	if d.RetryAfter > 0 {
		t = seconds(d.RetryAfter, 1)
		retry := t
		if l.o.Jitter > 0 {
			retry += seconds(time.Duration(rand.Int64N(int64(l.o.Jitter)+1)), 0)
		}
		set(headerRetryAfter, strconv.AppendInt(buf[:0], clamp(retry), 10))
	}
	buf = visitFields(set, res, l.o.LegacyHeaders, t, buf)
	set("Cache-Control", noStore)
	return buf
}

var noStore = []byte("no-store")

// WriteShed answers a request a concurrency limit refused: 503, the
// draft's temporary-reduced-capacity problem, and a Retry-After of one
// second (a permit is usually free well before). Every plane sheds with it
// or, without an http.ResponseWriter, with the same fields and
// AppendProblem(ShedProblem()).
func WriteShed(w http.ResponseWriter) {
	w.Header().Set(headerRetryAfter, "1")
	WriteProblem(w, ShedProblem())
}

// ShedProblem is the answer to a request a concurrency limit refused, for
// servers that write it themselves (with Retry-After: 1).
func ShedProblem() *Problem {
	return &Problem{Type: ProblemReducedCapacity, Title: titleReducedCapacity, Status: http.StatusServiceUnavailable,
		Detail: "The service is at the limit of the requests it can serve at once. Try again in about 1 second."}
}

// Headers writes to h the fields the middleware would send with res: for a
// rejection, Retry-After, the RateLimit fields and Cache-Control; for an
// allowed result, the RateLimit fields as AllowedHeaders says. Services that
// answer for another proxy (forward-auth, a decision API) use it to speak
// exactly as the middleware does.
func (l *Limiter) Headers(h http.Header, res *engine.Result) {
	bp := headerBufs.Get().(*[]byte)
	defer headerBufs.Put(bp)
	if !res.Allowed {
		*bp = l.rejectHeaders(h, res, *bp)
		return
	}
	if l.sendAllowedHeaders(res) {
		*bp = setHeaders(h, res, l.o.LegacyHeaders, 0, *bp, &l.policies)
	}
}

// VisitHeaders calls set with each field Headers would write, in a fixed
// order, for servers with a header type of their own: no map, and no copy
// of a value unless set makes one. A value is valid only during its call.
func (l *Limiter) VisitHeaders(res *engine.Result, set func(name string, value []byte)) {
	bp := headerBufs.Get().(*[]byte)
	defer headerBufs.Put(bp)
	if !res.Allowed {
		*bp = l.visitRejectFields(set, res, *bp)
		return
	}
	if l.sendAllowedHeaders(res) {
		*bp = visitFields(set, res, l.o.LegacyHeaders, 0, *bp)
	}
}

// headerBufs are Headers' buffers for the fields it writes: a field's
// value is copied out of the buffer into its own string, and the buffer is
// used again.
var headerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// Status returns the HTTP status for a rejected result: 429, 503 when a
// fail-closed rule lost its store, 400 for a missing key.
func Status(res *engine.Result) int { return ProblemFor(res).Status }

// readBody reads up to rules.MaxBodyBytes of r's body for body key sources
// and puts it back in front of the rest, so the handler reads it all. It
// reports whether the body is longer (one byte more was read to know).
func readBody(r *http.Request) ([]byte, bool) {
	var buf bytes.Buffer
	n, err := io.CopyN(&buf, r.Body, rules.MaxBodyBytes+1)
	rest := r.Body
	r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(buf.Bytes()), rest), Closer: rest}
	if err != nil && err != io.EOF || n == 0 {
		return nil, false
	}
	if n > rules.MaxBodyBytes {
		return buf.Bytes()[:rules.MaxBodyBytes], true
	}
	return buf.Bytes(), false
}

type replayBody struct {
	io.Reader
	io.Closer
}

// statusWriter remembers the status the handler wrote and, with keep, the
// first MaxSettleBody bytes of the body (for a reserve rule's actualJSON).
type statusWriter struct {
	http.ResponseWriter
	status int
	keep   bool
	body   []byte
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	if s.keep {
		if room := MaxSettleBody + 1 - len(s.body); room > 0 {
			s.body = append(s.body, b[:min(len(b), room)]...)
		}
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Hijack hands the connection over, through the underlying writer (see
// http.ResponseController): a handler takes a connection over to switch
// protocols, so the status recorded is 101 Switching Protocols.
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil && s.status == 0 {
		s.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

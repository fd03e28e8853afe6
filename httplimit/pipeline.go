package httplimit

import (
	"context"
	"encoding/binary"
	"net/http"
	"net/netip"
	"time"

	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
)

// An Exchange is one request on one HTTP stack: what the pipeline
// (Limiter.Serve) needs from the stack to answer it, hold it and pass it on.
// The net/http middleware, sluice's fasthttp gateway and the forward-auth
// endpoint are each an Exchange and nothing more, so that every behaviour of
// a request's life is written once, in Serve, and holds on every plane.
type Exchange interface {
	// Context is the request's context: the store calls run under it.
	Context() context.Context
	// Hold keeps the request waiting for d and reports whether its client
	// is still there at the end. It returns false as soon as the stack
	// sees the client go.
	Hold(d time.Duration) bool
	// Abandon ends the exchange of a client that has gone, answering
	// nothing: its connection is closed (an answer it may still read must
	// not claim a success that did not happen).
	Abandon()
	// Refuse answers a refused result: its status, the fields of
	// Limiter.VisitHeaders and the problem of FillProblem (or the stack's
	// own rendering of them).
	Refuse(res *engine.Result)
	// Shed answers 503 when the concurrency limit has no room: ShedProblem
	// with Retry-After: 1 and Cache-Control: no-store.
	Shed()
	// Forward passes the admitted request on, with path (the normalised
	// path the rules matched) as its path, and answers the client with the
	// response and the allowed fields of res. It returns the response's
	// status; with watch false it may return 0. With keep it also keeps the
	// first MaxSettleBody bytes of the response's body for ResponseBody.
	// An upgrade the upstream accepts is answered 101 and tunnelled.
	Forward(path string, res *engine.Result, watch, keep bool) (status int)
	// ResponseHeader looks up a field of the response, after Forward.
	ResponseHeader(name string) string
	// ResponseBody is the body Forward kept, or nil.
	ResponseBody() []byte
	// SeesResponse reports whether Forward sees the upstream's response.
	// A forward-auth endpoint answers before its proxy passes the request
	// on: there countOn rules are checked and never charged (the
	// application charges them, POST /v1/charge), and reserve rules take
	// their estimate as the cost, with no reservation to settle.
	SeesResponse() bool
	// TraceContext names the plane for a decision's span (tracing: http,
	// gateway, auth) and gives the request's header fields, which carry
	// the caller's trace context. Called only when tracing is on.
	TraceContext() (via string, header HeaderCarrier)
}

// Serve is one request's life, the same on every plane: the check against
// the rules (all or nothing), the refusal, the leaky-queue delay with its
// units given back if the client leaves, the concurrency permit, the
// forwarding, and after the response the countOn charge and the settling
// of reservations. req is the request as the rules read it, built by the
// plane; Serve normalises its path (engine.Check): req.Path is left as the
// rules matched it, and the path forwarded is res.Path, the same in the
// case it was sent.
//
// The order is the contract every plane shares:
//
//  1. check: refused → x.Refuse, nothing forwarded;
//  2. delay: beyond Options.MaxDelay → units given back, refused; the
//     client leaving during it → units given back, nothing forwarded;
//  3. permit (Options.Concurrency): none → x.Shed;
//  4. x.Forward;
//  5. the permit released (a 5xx counts as dropped), the latency and
//     outcome told to Options.Pressure;
//  6. Finish: charge and settle from the response, even if the client has
//     gone.
func (l *Limiter) Serve(x Exchange, req *rules.Request, res *engine.Result) {
	cfg := l.e.Config()
	sees := x.SeesResponse()
	ctx := x.Context()
	var span DecisionSpan
	if l.o.Tracer != nil {
		via, header := x.TraceContext()
		ctx, span = l.o.Tracer.StartDecision(ctx, via, header)
	}
	l.e.Check(ctx, req, engine.CheckOptions{Reserve: sees && cfg.SettlesFromResponses(), Via: l.o.LogVia, LogPath: l.o.LogPath}, res)
	if span != nil {
		span.End(res, nil)
	}
	if !res.Allowed {
		x.Refuse(res)
		return
	}
	if res.Delay > 0 && !l.hold(x, res) {
		return
	}
	settles, charges := res.Settles(), res.Charges() && sees
	// The pressure that adaptive rules follow is sampled from the answers
	// of the service to requests they apply to, each client one voice
	// (concurrency.Pressure): a client failing its own requests elsewhere,
	// or here, does not shrink them for everyone. A request the concurrency
	// limit sheds never reached the service and says nothing of it: under
	// a flood, counting the flood's victims as failures would let the
	// flooder lower everyone's rate.
	pressure := l.o.Pressure
	if pressure != nil && (!res.Adaptive() || !sees) { // an exchange that sees no answer has none to sample
		pressure = nil
	}
	watch := pressure != nil || l.o.Concurrency != nil || settles || charges
	status := 0
	if c := l.o.Concurrency; c != nil && !holdsPermit(x) {
		p, err := c.AcquireAt(x.Context(), res.Tier())
		if err != nil {
			x.Shed()
			return
		}
		// Released even if the handler panics.
		defer func() {
			if overloaded(status) {
				p.Release(concurrency.Dropped)
			} else {
				p.Release(concurrency.Success)
			}
		}()
	}
	if pressure != nil { // the service's latency: from here, not from a wait for a concurrency slot
		start, client := time.Now(), clientID(req.ClientIP, cfg.IPv6Prefix)
		defer func() { pressure.Observe(client, time.Since(start), status >= 500 || status == 0) }()
	}
	status = x.Forward(res.Path, res, watch, settles && cfg.SettlesFromJSON())
	if status == 0 && watch {
		status = 200 // a handler that wrote nothing answered 200
	}
	if charges || settles {
		Finish(x.Context(), l.e, res, status, x.ResponseHeader, x.ResponseBody())
	}
}

// A PermitHolder is an Exchange that runs within a concurrency permit
// held already: a message a gRPC stream receives, within its stream's.
// Serve takes no permit of its own for it (a stream at the limit would
// otherwise never be handed a message).
type PermitHolder interface {
	HoldsPermit() bool
}

func holdsPermit(x Exchange) bool {
	h, ok := x.(PermitHolder)
	return ok && h.HoldsPermit()
}

// hold waits out a leaky-queue rule's delay. It reports false, after
// refusing or giving the units back, when the request must not go on.
func (l *Limiter) hold(x Exchange, res *engine.Result) bool {
	if res.Delay > l.o.MaxDelay {
		l.e.Refund(x.Context(), res)
		res.Allowed = false
		res.Decision.Allowed = false
		res.Decision.RetryAfter = res.Delay - l.o.MaxDelay
		x.Refuse(res)
		return false
	}
	if x.Hold(res.Delay) {
		return true
	}
	// The client gave up: its units go back, though its context is done.
	l.e.Refund(context.WithoutCancel(x.Context()), res)
	x.Abandon()
	return false
}

// Hold is Exchange.Hold for a stack whose request context ends when the
// client goes (net/http's does): it waits d, or until ctx is done.
func Hold(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// clientID names a client for the pressure signal: its address, an IPv6
// one by the prefix the rules count it by (a client owns a whole /64).
func clientID(a netip.Addr, v6prefix int) uint64 {
	a = a.Unmap()
	if a.Is6() && v6prefix > 0 && v6prefix < 128 {
		p, _ := a.Prefix(v6prefix)
		a = p.Addr()
	}
	b := a.As16()
	return (binary.BigEndian.Uint64(b[:8])*0x9e3779b97f4a7c15 ^ binary.BigEndian.Uint64(b[8:])) * 0xbf58476d1ce4e5b9
}

// overloaded reports whether an answer's status says the upstream is
// overloaded or out of reach (none, 502, 503, 504): a drop for the
// concurrency limit. Any other answer is a latency sample, 500 included: a
// client can provoke errors of its own at will, and they say nothing of
// the upstream's capacity, so they must not shrink it for everyone.
func overloaded(status int) bool {
	return status == 0 || status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// Abandon ends a net/http exchange whose client has gone without writing an
// answer: the connection is taken over and closed, or where it cannot be
// (HTTP/2), the handler is aborted with http.ErrAbortHandler, which the
// server takes as the end of the stream. A handler that returned without
// writing would be answered 200 with an empty body.
func Abandon(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
		return
	}
	panic(http.ErrAbortHandler)
}

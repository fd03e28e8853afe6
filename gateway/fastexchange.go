package gateway

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/internal/view"
	"github.com/sluice-rl/sluice/tracing"
	"github.com/valyala/fasthttp"
)

// fastExchange is the fasthttp plane's side of the pipeline.
type fastExchange struct {
	g    *Fast
	ctx  *fasthttp.RequestCtx
	st   *fastState
	peer netip.Addr
	keep bool
	// fromTrusted: the peer is a trusted proxy, whose forwarding fields
	// are kept.
	fromTrusted bool
}

func (x *fastExchange) Context() context.Context { return x.ctx }

// Hold waits, looking at the client's connection every holdPoll: fasthttp
// does not read a connection while its handler runs, so a client that
// leaves is seen by peeking at its socket (peerClosed).
func (x *fastExchange) Hold(d time.Duration) bool {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left > 0 {
			time.Sleep(min(left, holdPoll))
		}
		if peerClosed(x.ctx.Conn()) {
			return false
		}
		if left <= holdPoll {
			return true
		}
	}
}

// holdPoll is how often a held request's connection is looked at.
const holdPoll = 20 * time.Millisecond

func (x *fastExchange) Refuse(res *engine.Result) { x.g.reject(x.ctx, res, x.st) }

// Abandon closes the client's connection without an answer.
func (x *fastExchange) Abandon() {
	x.ctx.HijackSetNoResponse(true)
	x.ctx.Hijack(func(net.Conn) {}) // fasthttp closes it once this returns
}

func (x *fastExchange) Shed() {
	ctx, st := x.ctx, x.st
	p := httplimit.ShedProblem()
	st.body = httplimit.AppendProblem(st.body[:0], p)
	ctx.SetStatusCode(p.Status)
	ctx.SetContentType("application/problem+json")
	ctx.Response.Header.Set("Retry-After", "1")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetBody(st.body)
}

func (x *fastExchange) Forward(path string, res *engine.Result, watch, keep bool) int {
	x.keep = keep
	x.g.forward(x.ctx, x.peer, x.fromTrusted, path, res, x.st, keep)
	return x.ctx.Response.StatusCode()
}

func (x *fastExchange) ResponseHeader(name string) string {
	return string(x.ctx.Response.Header.Peek(name))
}

func (x *fastExchange) SeesResponse() bool { return true }

func (x *fastExchange) TraceContext() (string, httplimit.HeaderCarrier) {
	return "gateway", tracing.HeaderFunc(x.requestHeader)
}

// requestHeader is a request field by name in any case: the names are kept
// as sent (DisableHeaderNamesNormalizing), so Peek would match one case.
func (x *fastExchange) requestHeader(name string) string {
	for k, v := range x.ctx.Request.Header.All() {
		if strings.EqualFold(view.String(k), name) {
			return string(v)
		}
	}
	return ""
}

func (x *fastExchange) ResponseBody() []byte {
	if !x.keep || x.ctx.Response.IsBodyStream() {
		return nil
	}
	return x.ctx.Response.Body()
}

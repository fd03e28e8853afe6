package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"

	"github.com/valyala/fasthttp"
)

// upgrade passes an upgrade request on (see Upgrades): a tunnel once the
// upstream has switched to the protocol asked, its answer relayed
// otherwise.
func (g *Fast) upgrade(ctx *fasthttp.RequestCtx, st *fastState, asked string) {
	g.up.serve(ctx, &fastUpgrade{g: g, ctx: ctx, st: st}, asked)
}

// fastUpgrade is the fasthttp plane's side of an upgrade.
type fastUpgrade struct {
	g   *Fast
	ctx *fasthttp.RequestCtx
	st  *fastState
}

func (x *fastUpgrade) problem(status int, title, detail string, retry bool) {
	x.g.problem(x.ctx, status, title, detail)
	if retry {
		x.ctx.Response.Header.Set("Retry-After", "1")
	}
}

func (x *fastUpgrade) writeRequest(w *bufio.Writer) error { return x.ctx.Request.Write(w) }

func (x *fastUpgrade) failed(err error) { x.g.upstreamFailed(x.ctx, err) }

func (x *fastUpgrade) relay(resp *http.Response, body io.ReadCloser) {
	x.ctx.SetStatusCode(resp.StatusCode)
	for k, vs := range resp.Header {
		if k == "Content-Length" {
			continue // SetBodyStream sets it
		}
		for _, v := range vs {
			x.ctx.Response.Header.Add(k, v)
		}
	}
	for k, vs := range x.st.out {
		for _, v := range vs {
			x.ctx.Response.Header.Set(k, v)
		}
	}
	x.ctx.SetBodyStream(body, int(resp.ContentLength)) // closed once sent
}

// hijack takes the connection over once the handler has returned;
// fasthttp then reads first, through c, what the client sent after its
// request.
func (x *fastUpgrade) hijack(then func(net.Conn, io.Reader, http.Header)) bool {
	extra := x.st.out.Clone() // st goes back to its pool before the tunnel opens
	x.ctx.SetStatusCode(http.StatusSwitchingProtocols)
	x.ctx.HijackSetNoResponse(true)
	x.ctx.Hijack(func(c net.Conn) { then(c, c, extra) })
	return true
}

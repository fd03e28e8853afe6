package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/valyala/fasthttp"
)

// decider is -mode decide: the event loop of -mode loop, but each request
// is parsed as the gateway's fasthttp plane parses it (fasthttp's request
// header parser) and decided as the gateway decides it (the engine on the
// embedded store behind the sharing layer, the rule file the gateway runs)
// before its refusal is rendered (httplimit's fields and problem, kept
// while refusals repeat, as the plane keeps them). What it leaves out is
// what the gateway does besides: its request loop's bookkeeping, its
// observability (metrics, live page, decision log, hot keys) and any
// forwarding (an admitted request is answered 200 here, not passed on).
// It bounds what a plane of the gateway's own on an event loop could do
// on the refusal path, beside the Go floor of -mode goroutine.
type decider struct {
	gnet.BuiltinEventEngine
	e       *engine.Engine
	limiter *httplimit.Limiter
}

// decideConn is a connection's working memory, reused request after
// request.
type decideConn struct {
	peer    netip.Addr
	out     []byte
	rd      bytes.Reader
	br      *bufio.Reader
	hdr     fasthttp.RequestHeader
	req     rules.Request
	res     engine.Result
	refusal httplimit.Refusal // the last refusal, written again while refusals repeat
}

func newDecider(config string) (*decider, error) {
	b, err := os.ReadFile(config)
	if err != nil {
		return nil, err
	}
	cfg, err := rules.Parse(config, b)
	if err != nil {
		return nil, err
	}
	store, _ := share.Wrap(memory.New(), share.Options{ // as sluice gateway wires the embedded store
		Local: memory.New(), NoDenyCache: true,
		Sharing:  func(string) sluice.Sharing { return sluice.Sharing{} },
		Scale:    func(string) float64 { return 1 },
		AllExact: func() bool { return true },
	})
	e, err := engine.New(cfg, engine.Options{Store: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	return &decider{e: e, limiter: httplimit.New(e, httplimit.Options{})}, nil
}

func (d *decider) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	dc := &decideConn{br: bufio.NewReaderSize(nil, 4096)}
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		dc.peer = a.AddrPort().Addr().Unmap()
	}
	c.SetContext(dc)
	return nil, gnet.None
}

func (d *decider) OnTraffic(c gnet.Conn) gnet.Action {
	dc := c.Context().(*decideConn)
	in, _ := c.Peek(-1)
	dc.out = dc.out[:0]
	n, ok := eachHead(in, func(head []byte) bool { return d.answer(dc, head) })
	if !ok {
		return gnet.Close
	}
	reply(c, n, dc.out)
	return gnet.None
}

// answer parses, decides and answers one request's head.
func (d *decider) answer(dc *decideConn, head []byte) bool {
	dc.rd.Reset(head)
	dc.br.Reset(&dc.rd)
	if dc.hdr.Read(dc.br) != nil {
		return false
	}
	uri := dc.hdr.RequestURI()
	path, query := uri, []byte(nil)
	if q := bytes.IndexByte(uri, '?'); q >= 0 {
		path, query = uri[:q], uri[q+1:]
	}
	dc.req = rules.Request{Method: view(dc.hdr.Method()), Host: view(dc.hdr.Host()), Path: view(path), RawQuery: view(query), ClientIP: dc.peer}
	d.e.Check(context.Background(), &dc.req, engine.CheckOptions{}, &dc.res)
	if dc.res.Allowed {
		dc.out = append(dc.out, "HTTP/1.1 200 OK\r\nServer: sluice\r\nContent-Length: 3\r\n\r\nok\n"...)
		return true
	}
	r := &dc.refusal
	r.Render(d.limiter, &dc.res)
	dc.out = append(dc.out, "HTTP/1.1 "...)
	dc.out = strconv.AppendInt(dc.out, int64(r.Status()), 10)
	dc.out = append(dc.out, ' ')
	dc.out = append(dc.out, http.StatusText(r.Status())...)
	dc.out = append(dc.out, "\r\nServer: sluice\r\nDate: "...)
	dc.out = append(dc.out, *date.Load()...)
	dc.out = append(dc.out, "\r\nContent-Type: application/problem+json\r\nContent-Length: "...)
	dc.out = strconv.AppendInt(dc.out, int64(len(r.Body())), 10)
	dc.out = append(dc.out, "\r\n"...)
	for i := range r.Fields() {
		name, v := r.Field(i)
		dc.out = append(append(append(append(dc.out, name...), ": "...), v...), "\r\n"...)
	}
	dc.out = append(dc.out, "\r\n"...)
	dc.out = append(dc.out, r.Body()...)
	return true
}

// view is b as a string, without a copy: the request's fields live as long
// as its answer, as the gateway's do.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

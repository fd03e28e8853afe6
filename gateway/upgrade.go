package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upgrades are requests like any other. A request that asks to switch
// protocols (RFC 9110 §7.8: Connection: Upgrade and Upgrade: PROTOCOL, as a
// WebSocket handshake or h2c asks) has been checked by the rules like any
// request before it gets here. It is then sent to the upstream on a
// connection of its own, and only if the upstream answers
// 101 Switching Protocols to the protocol asked does the client's
// connection become a tunnel to it. Any other answer is relayed as it is,
// the upstream's connection closed, and the client's connection goes on as
// HTTP through the limiter: what the client sends next is a request, checked
// like the first. Without that wait, an upstream that ignores the upgrade
// (most do, as RFC 9110 allows) would leave a raw tunnel carrying requests
// no rule ever sees.
//
// A tunnel ends when either side closes, when no byte has crossed it either
// way for IdleTimeout, or MaxDuration after it opened; at most MaxTunnels
// are open at once (beyond: 503). Each holds two 8 KiB copy buffers and
// two file descriptors.
type Upgrades struct {
	// Refuse answers every upgrade request 501 (after the rules have
	// counted it) instead of passing it on.
	Refuse bool
	// IdleTimeout ends a tunnel no byte has crossed for this long
	// (default 2 minutes).
	IdleTimeout time.Duration
	// MaxDuration ends a tunnel this long after it opened (default 1 hour).
	MaxDuration time.Duration
	// MaxTunnels bounds the tunnels open at once (default: a quarter of
	// the process's open-file limit, at most 10,000: each tunnel holds two
	// descriptors).
	MaxTunnels int
}

// The defaults of Upgrades.
const (
	DefaultTunnelIdle  = 2 * time.Minute
	DefaultTunnelMax   = time.Hour
	DefaultMaxTunnels  = 10000
	tunnelBufferSize   = 8 << 10
	upstreamDialTimout = 5 * time.Second
)

// upgrader passes upgrade requests to one upstream; both data planes use
// it, so an upgrade behaves the same on each.
type upgrader struct {
	Upgrades
	upstream *url.URL
	addr     string
	timeout  time.Duration // to connect and to have the upstream's answer
	open     atomic.Int64
	tls      *tls.Config // for an https upstream
}

func newUpgrader(upstream *url.URL, g Options) *upgrader {
	o := g.Upgrades
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultTunnelIdle
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = DefaultTunnelMax
	}
	if o.MaxTunnels <= 0 {
		o.MaxTunnels = defaultMaxTunnels()
	}
	u := &upgrader{Upgrades: o, upstream: upstream, addr: hostPort(upstream), timeout: g.Timeout}
	if upstream.Scheme == "https" {
		u.tls = &tls.Config{}
		if g.UpstreamTLS != nil {
			u.tls = g.UpstreamTLS.Clone()
		}
		if u.tls.ServerName == "" {
			u.tls.ServerName = upstream.Hostname()
		}
		// HTTP/1.1 only: an upgrade does not exist in HTTP/2.
		u.tls.NextProtos = []string{"http/1.1"}
	}
	return u
}

// isUpgrade reports whether a request with these Connection and Upgrade
// fields asks to switch protocols.
func isUpgrade(connection, upgrade string) bool {
	return upgrade != "" && hasToken(connection, "upgrade")
}

// hasToken reports whether the comma-separated list v holds token, in any
// case.
func hasToken(v, token string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// upgradeSide is what a data plane supplies to pass an upgrade on: its
// own bytes, how it writes the request to the upstream, an answer and a
// problem to the client, and how it takes the client's connection over.
// upgrader.serve holds the flow, the same for both planes.
type upgradeSide interface {
	// problem answers status with a problem+json body, and Retry-After: 1
	// if retry.
	problem(status int, title, detail string, retry bool)
	// writeRequest writes the request, as the upstream is to get it.
	writeRequest(w *bufio.Writer) error
	// failed answers the upstream's failure (502 or 504), or abandons the
	// answer if the client has gone.
	failed(err error)
	// relay answers the upstream's ordinary answer (its hop-by-hop fields
	// dropped) and closes body when done; the client's connection goes on.
	relay(resp *http.Response, body io.ReadCloser)
	// hijack takes the client's connection over, now or once the plane's
	// handler has returned, and calls then with it, what the client sent
	// after its request, and the fields the limit adds to the 101; false if
	// it cannot.
	hijack(then func(c net.Conn, fromClient io.Reader, extra http.Header)) bool
}

// serve passes one upgrade request on: refused with 501 if upgrades are,
// 503 past MaxTunnels; otherwise the request goes to the upstream, and only
// an upstream's 101 switching to the protocol asked opens a tunnel (any
// other answer is relayed as it is, and a 101 to another protocol is a
// 502). Every tunnel slot taken is given back on every path.
func (u *upgrader) serve(ctx context.Context, side upgradeSide, asked string) {
	if u.Refuse {
		side.problem(http.StatusNotImplemented, "Not Implemented", "this gateway does not pass protocol upgrades", false)
		return
	}
	if !u.take() {
		side.problem(http.StatusServiceUnavailable, "Service Unavailable", "too many upgraded connections are open", true)
		return
	}
	a, err := u.exchange(ctx, side.writeRequest)
	if err != nil {
		u.open.Add(-1)
		side.failed(err)
		return
	}
	if !a.switched(asked) {
		u.open.Add(-1)
		body := a.body()
		if a.resp.StatusCode == http.StatusSwitchingProtocols {
			body.Close()
			side.failed(errWrongSwitch)
			return
		}
		dropHopHeader(a.resp.Header)
		side.relay(a.resp, body)
		return
	}
	taken := side.hijack(func(c net.Conn, fromClient io.Reader, extra http.Header) {
		c.SetDeadline(time.Now().Add(u.timeout)) // and none after: the tunnel keeps its own
		w := bufio.NewWriterSize(c, 1024)
		if a.writeSwitch(w, extra) != nil || w.Flush() != nil {
			u.open.Add(-1)
			c.Close()
			a.conn.Close()
			return
		}
		c.SetDeadline(time.Time{})
		u.tunnel(c, fromClient, a)
	})
	if !taken {
		u.open.Add(-1)
		a.conn.Close()
		side.problem(http.StatusInternalServerError, "Internal Server Error", "this connection cannot be upgraded", false)
	}
}

// upstreamAnswer is the upstream's answer to an upgrade request, on the
// connection that carried it.
type upstreamAnswer struct {
	conn net.Conn
	br   *bufio.Reader
	resp *http.Response
}

// exchange sends an upgrade request (written by write) to the upstream on a
// new connection and reads its answer, within the timeout. The caller owns
// the answer's connection: it either tunnels it or closes it.
func (u *upgrader) exchange(ctx context.Context, write func(*bufio.Writer) error) (*upstreamAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	d := &net.Dialer{Timeout: min(u.timeout, upstreamDialTimout)}
	var c net.Conn
	var err error
	if u.tls != nil {
		c, err = (&tls.Dialer{NetDialer: d, Config: u.tls}).DialContext(ctx, "tcp", u.addr)
	} else {
		c, err = d.DialContext(ctx, "tcp", u.addr)
	}
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	bw := bufio.NewWriterSize(c, 4096)
	if err := write(bw); err != nil || bw.Flush() != nil {
		c.Close()
		return nil, fmt.Errorf("sending the upgrade request: %w", errors.Join(err, bw.Flush()))
	}
	br := bufio.NewReaderSize(c, 4096)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(br, nil) // 100 Continue and the like: the answer follows
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return &upstreamAnswer{conn: c, br: br, resp: resp}, nil
}

// switched reports whether the upstream accepted the protocol asked: 101
// with that protocol in its Upgrade field.
func (a *upstreamAnswer) switched(asked string) bool {
	return a.resp.StatusCode == http.StatusSwitchingProtocols &&
		hasToken(a.resp.Header.Get("Connection"), "upgrade") &&
		strings.EqualFold(strings.TrimSpace(a.resp.Header.Get("Upgrade")), strings.TrimSpace(asked))
}

// body is the answer's body for relaying; closing it closes the upstream's
// connection, which is never used again (it may already speak another
// protocol).
func (a *upstreamAnswer) body() io.ReadCloser {
	return &closingBody{ReadCloser: a.resp.Body, conn: a.conn}
}

type closingBody struct {
	io.ReadCloser
	conn net.Conn
}

func (b *closingBody) Close() error {
	b.ReadCloser.Close()
	return b.conn.Close()
}

// writeSwitch writes the 101 head to the client: the upstream's fields
// without the hop-by-hop ones, Connection and Upgrade for the protocol, and
// extra (the limit's fields).
func (a *upstreamAnswer) writeSwitch(w io.Writer, extra http.Header) error {
	h := a.resp.Header.Clone()
	dropHopHeader(h)
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", a.resp.Header.Get("Upgrade"))
	if _, err := io.WriteString(w, "HTTP/1.1 101 Switching Protocols\r\n"); err != nil {
		return err
	}
	if err := h.Write(w); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\r\n")
	return err
}

// dropHopHeader removes the hop-by-hop fields of h, and those its
// Connection field names.
func dropHopHeader(h http.Header) {
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// tunnel copies bytes both ways between the client (reading fromClient,
// which may hold bytes the client sent after its request) and the
// upstream's answer, until either side closes, the tunnel is idle for
// IdleTimeout, or MaxDuration has passed. It closes both connections.
func (u *upgrader) tunnel(client net.Conn, fromClient io.Reader, a *upstreamAnswer) {
	defer u.open.Add(-1)
	up := a.conn
	defer client.Close()
	defer up.Close()
	end := time.AfterFunc(u.MaxDuration, func() { client.Close(); up.Close() })
	defer end.Stop()
	var last atomic.Int64 // when a byte last crossed, either way
	last.Store(time.Now().UnixNano())
	done := make(chan struct{}, 1)
	go func() {
		u.pipe(up, client, fromClient, &last)
		done <- struct{}{}
	}()
	u.pipe(client, up, a.br, &last)
	// Either side's end ends the tunnel: closing both stops the other copy.
	client.Close()
	up.Close()
	<-done
}

var tunnelBuffers = sync.Pool{New: func() any { b := make([]byte, tunnelBufferSize); return &b }}

// pipe copies src (read through r) to dst until an error, or until neither
// way has carried a byte for IdleTimeout.
func (u *upgrader) pipe(dst net.Conn, src net.Conn, r io.Reader, last *atomic.Int64) {
	bp := tunnelBuffers.Get().(*[]byte)
	defer tunnelBuffers.Put(bp)
	buf := *bp
	for {
		src.SetReadDeadline(time.Now().Add(u.IdleTimeout))
		n, err := r.Read(buf)
		if n > 0 {
			now := time.Now()
			last.Store(now.UnixNano())
			dst.SetWriteDeadline(now.Add(u.IdleTimeout))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < u.IdleTimeout {
				continue // idle this way, busy the other: the tunnel lives
			}
			return
		}
	}
}

// defaultMaxTunnels is a quarter of the open-file limit, at most
// DefaultMaxTunnels: tunnels alone can take half the descriptors.
func defaultMaxTunnels() int {
	if n := fileLimit(); n > 0 {
		return max(16, min(DefaultMaxTunnels, n/4))
	}
	return DefaultMaxTunnels
}

// take reserves a tunnel; false when MaxTunnels are open.
func (u *upgrader) take() bool {
	if u.open.Add(1) > int64(u.MaxTunnels) {
		u.open.Add(-1)
		return false
	}
	return true
}

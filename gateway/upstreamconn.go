package gateway

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// DefaultUpstreamIdle is how long the gateway keeps an idle connection to
// its upstream by default: under the shortest keep-alive common upstreams
// keep (Node's and Apache's 5 s; nginx keeps 75 s, cloud load balancers
// 60 s), so that a pooled connection is seldom one the upstream is closing.
const DefaultUpstreamIdle = 4 * time.Second

// An upstream closes a keep-alive connection it has left idle for its own
// timeout. A request sent on such a pooled connection meets a closed
// socket and reads no answer, which a proxy must not turn into a 502.
// net/http's transport reads every idle connection in the background and
// drops it from its pool when the upstream closes it. fasthttp does not
// read idle connections, so the fasthttp plane's connections look before
// each reuse instead: upstreamConns wraps every connection the plane
// dials, and a connection that was idle is checked when fasthttp sets the
// deadline for writing the next request, before any byte of it (the body
// included) is read or written. A connection that is gone, or idle longer
// than the upstream announced it keeps one (Keep-Alive: timeout=N), fails
// with errStaleConn, nothing sent; fasthttp closes it, and the plane sends
// the request again (staleRetries) on another, or a new, connection.
//
// What remains is the instant between the look and the upstream's close:
// the request is written as the upstream closes, and no answer byte comes.
// As net/http's transport does, such a request goes again if it can be
// sent twice (an idempotent method, a body not streamed) and the
// connection it failed on was a reused one: an idle timer closes pooled
// connections, not new ones. A new connection that fails before answering
// means the upstream itself is failing, and the request is answered 502
// (Fast.send keeps the count, freshFailed, that tells them apart).

// errStaleConn is a pooled upstream connection found closed (or past the
// upstream's keep-alive) before a request was written on it.
var errStaleConn = errors.New("sluice: pooled upstream connection was closed by the upstream")

// staleLook is how long a connection must have been idle to be looked at
// before reuse: one busy with back-to-back requests is not.
const staleLook = 5 * time.Millisecond

type upstreamConns struct {
	idle        time.Duration // the most a connection is kept idle
	announced   atomic.Int64  // the upstream's Keep-Alive timeout, in ns; 0: none
	freshFailed atomic.Int64  // new connections that failed before their first answer byte
}

// dial dials addr and wraps the connection (fasthttp.HostClient.DialTimeout).
func (u *upstreamConns) dial(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	var err error
	if timeout > 0 {
		c, err = fasthttp.DialTimeout(addr, timeout)
	} else {
		c, err = fasthttp.Dial(addr)
	}
	if err != nil {
		return nil, err
	}
	return &upstreamConn{Conn: &lazyConn{Conn: c}, u: u}, nil
}

// keepFor is how long a connection may stay idle: the gateway's limit, or
// less if the upstream announced it keeps one for less (a second's
// margin, or a quarter of its timeout if that is shorter).
func (u *upstreamConns) keepFor() time.Duration {
	keep := u.idle
	if a := time.Duration(u.announced.Load()); a > 0 {
		keep = min(keep, a-min(time.Second, a/4))
	}
	return keep
}

// announce reads an answer's Keep-Alive field ("timeout=5, max=100").
func (u *upstreamConns) announce(field []byte) {
	for part := range bytes.SplitSeq(field, []byte(",")) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(part), []byte("="))
		if !ok || !bytes.EqualFold(bytes.TrimSpace(k), []byte("timeout")) {
			continue
		}
		if n, err := strconv.Atoi(string(bytes.TrimSpace(v))); err == nil && n > 0 && n < 1<<20 {
			if d := int64(time.Duration(n) * time.Second); u.announced.Load() != d {
				u.announced.Store(d)
			}
		}
		return
	}
}

// upstreamConn is one pooled connection. fasthttp uses a connection for
// one request at a time, so its fields need no lock.
type upstreamConn struct {
	net.Conn
	u        *upstreamConns
	lastRead time.Duration // when an answer was last read from it (monotonicNow)
	answered bool          // a read since the last write: the next write starts a request
	served   bool          // an answer byte was ever read: the connection is a reused one
}

func (c *upstreamConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.lastRead, c.answered = monotonicNow(), true
	if n > 0 {
		c.served = true
	} else if err != nil {
		c.failed(err)
	}
	return n, err
}

func (c *upstreamConn) Write(b []byte) (int, error) {
	c.answered = false
	n, err := c.Conn.Write(b)
	if err != nil {
		c.failed(err)
	}
	return n, err
}

// failed counts a new connection's failure before its first answer byte;
// a slow upstream's timeout is not one.
func (c *upstreamConn) failed(err error) {
	if t, ok := err.(interface{ Timeout() bool }); !c.served && (!ok || !t.Timeout()) {
		c.u.freshFailed.Add(1)
	}
}

// monotonicNow is the time on the monotonic clock alone: one clock read
// where time.Now makes two (the wall clock's too), on every read from an
// upstream.
func monotonicNow() time.Duration { return time.Since(monotonicEpoch) }

var monotonicEpoch = time.Now()

// SetWriteDeadline is where fasthttp starts a request on the connection:
// a reused one is looked at first.
func (c *upstreamConn) SetWriteDeadline(t time.Time) error {
	if c.answered {
		if idle := monotonicNow() - c.lastRead; idle >= staleLook && (idle >= c.u.keepFor() || upstreamGone(c.Conn)) {
			return errStaleConn
		}
	}
	return c.Conn.SetWriteDeadline(t)
}

// unanswered reports whether err is a request that met a closed
// connection before any answer byte: fasthttp reads any failure on the
// first byte as the server's close, and a write fails on a reset one.
func unanswered(err error) bool {
	return errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// resendable reports whether a request may be sent twice: an idempotent
// method (RFC 9110, 9.2.2) and a body held whole, not a stream that the
// first attempt read from.
func resendable(req *fasthttp.Request) bool {
	h := &req.Header
	idempotent := h.IsGet() || h.IsHead() || h.IsPut() || h.IsDelete() || h.IsOptions() || h.IsTrace() || h.IsQuery()
	return idempotent && !req.IsBodyStream()
}

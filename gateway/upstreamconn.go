package gateway

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
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
// a request then fails as it would on net/http, and fasthttp sends it
// again only if it is idempotent and has no streamed body.

// errStaleConn is a pooled upstream connection found closed (or past the
// upstream's keep-alive) before a request was written on it.
var errStaleConn = errors.New("sluice: pooled upstream connection was closed by the upstream")

// staleLook is how long a connection must have been idle to be looked at
// before reuse: one busy with back-to-back requests is not.
const staleLook = 5 * time.Millisecond

type upstreamConns struct {
	idle      time.Duration // the most a connection is kept idle
	announced atomic.Int64  // the upstream's Keep-Alive timeout, in ns; 0: none
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
	return &upstreamConn{Conn: c, u: u}, nil
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
	lastRead time.Time // when an answer was last read from it
	answered bool      // a read since the last write: the next write starts a request
}

func (c *upstreamConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.lastRead, c.answered = time.Now(), true
	return n, err
}

func (c *upstreamConn) Write(b []byte) (int, error) {
	c.answered = false
	return c.Conn.Write(b)
}

// SetWriteDeadline is where fasthttp starts a request on the connection:
// a reused one is looked at first.
func (c *upstreamConn) SetWriteDeadline(t time.Time) error {
	if c.answered {
		if idle := time.Since(c.lastRead); idle >= staleLook && (idle >= c.u.keepFor() || upstreamGone(c.Conn)) {
			return errStaleConn
		}
	}
	return c.Conn.SetWriteDeadline(t)
}

// staleRetry is fasthttp's RetryIfErr for the plane: a request whose
// connection was found stale was not sent and goes again; otherwise
// fasthttp's own rule, an idempotent request (its streamed bodies are
// never sent twice).
func staleRetry(req *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) {
	if errors.Is(err, errStaleConn) {
		return false, true
	}
	h := &req.Header
	return false, h.IsGet() || h.IsHead() || h.IsPut() || h.IsQuery()
}

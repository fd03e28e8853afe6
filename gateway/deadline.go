package gateway

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Arming a socket's deadline is not free: Go's runtime reads the clock
// twice and moves a timer under a lock (~80 ns here, beside the clock
// read that computes the deadline), and the fasthttp plane's connections
// are given one deadline after another: fasthttp sets three a request on
// the client's connection (the idle wait, the request's read, the
// answer's write) and two on the upstream's (the request's write, the
// answer's read), almost every one later than the last.
//
// lazyConn keeps each deadline it is asked for and arms the socket's only
// when the one asked for is sooner than the one armed. The invariant: the
// armed deadline is never later than the one asked for (none asked: any
// or none armed), so no read or write outlives its deadline. An armed
// deadline that passes before the one asked for is a false alarm: the read
// or write it stopped is armed again at the deadline asked for and goes
// on, so a caller sees a timeout when its own deadline has passed and
// never before. On a connection busy with requests, the socket's deadline
// is armed about once per timeout instead of several times a request.
//
// A lazyConn sits beneath TLS, never above it: crypto/tls keeps a write's
// timeout as the connection's error for good, so a false alarm must be
// met, and mended, below it. The reads and the read deadline are guarded
// apart from the writes and the write deadline: a tunnel reads a
// connection in one goroutine and writes it in another.
type lazyConn struct {
	net.Conn
	read, write lazyDeadline
}

// lazyDeadline is one direction's deadlines: asked is the caller's, armed
// the socket's (zero: none).
type lazyDeadline struct {
	mu           sync.Mutex
	asked, armed time.Time
}

// set records the deadline asked for and arms it through arm when it must
// come sooner than the one armed.
func (d *lazyDeadline) set(t time.Time, arm func(time.Time) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = t
	if t.IsZero() || (!d.armed.IsZero() && !t.Before(d.armed)) {
		return nil // the armed deadline comes first, or there is none to keep
	}
	if err := arm(t); err != nil {
		return err
	}
	d.armed = t
	return nil
}

// falseAlarm reports whether err is the armed deadline passing before the
// one asked for; if so it arms the one asked for, and the operation can go
// on.
func (d *lazyDeadline) falseAlarm(err error, arm func(time.Time) error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.asked.IsZero() && !time.Now().Before(d.asked) {
		return false // the caller's own deadline
	}
	if arm(d.asked) != nil {
		return false
	}
	d.armed = d.asked
	return true
}

func (c *lazyConn) SetReadDeadline(t time.Time) error {
	return c.read.set(t, c.Conn.SetReadDeadline)
}

func (c *lazyConn) SetWriteDeadline(t time.Time) error {
	return c.write.set(t, c.Conn.SetWriteDeadline)
}

func (c *lazyConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *lazyConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if n > 0 || err == nil || !c.read.falseAlarm(err, c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

func (c *lazyConn) Write(b []byte) (int, error) {
	written := 0
	for {
		n, err := c.Conn.Write(b[written:])
		written += n
		if err == nil || !c.write.falseAlarm(err, c.Conn.SetWriteDeadline) {
			return written, err
		}
	}
}

// SyscallConn gives the socket, for looking at it without reading
// (peerClosed, upstreamGone).
func (c *lazyConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("sluice: not a socket")
	}
	return sc.SyscallConn()
}

// lazyListener gives the fasthttp plane its client connections as
// lazyConns; a TLS connection as it comes, since a lazyConn cannot sit
// above TLS (the plane's listener is TLS's when the gateway terminates it,
// and a handshake costs far more than the deadlines).
type lazyListener struct{ net.Listener }

func (l lazyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if _, plain := c.(*net.TCPConn); !plain {
		return c, nil
	}
	return &lazyConn{Conn: c}, nil
}

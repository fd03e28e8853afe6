//go:build unix

package gateway

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// peerClosed reports whether the peer of c has closed its side of the
// connection (or reset it), without reading anything from it: it peeks at
// the socket (MSG_PEEK, non-blocking). fasthttp does not read a connection
// while its handler runs, so this is how a held request sees its client
// leave.
//
// Bytes waiting mean the client is there (it pipelined its next request),
// except through TLS, where a client that closes sends an alert first: a
// TLS 1.2 alert record (type 21), or a TLS 1.3 record carrying exactly an
// encrypted alert (type 23, 19 bytes: 2 of alert, 1 of inner type and a
// 16-byte AEAD tag) with nothing after it, counts as closed.
func peerClosed(c net.Conn) bool {
	tc, isTLS := c.(*tls.Conn)
	if isTLS {
		c = tc.NetConn()
	}
	var buf [25]byte
	n, waiting, closed := peek(c, buf[:])
	if isTLS && waiting {
		closed = buf[0] == 21 || n == 24 && buf[0] == 23 && buf[3] == 0 && buf[4] == 19
	}
	return closed
}

// upstreamGone reports whether an idle upstream connection c, one with no
// request outstanding, can no longer carry a request: its peer closed or
// reset it, or sent something no request asked for (a 408 before closing,
// a TLS close alert). It peeks, as peerClosed does, without reading.
func upstreamGone(c net.Conn) bool {
	var buf [1]byte
	_, waiting, closed := peek(c, buf[:])
	return waiting || closed
}

// peek looks at what c's socket holds without reading it (MSG_PEEK,
// non-blocking): n bytes waiting, or the peer's end of stream or reset
// (closed). A connection that is not a socket shows nothing.
func peek(c net.Conn, buf []byte) (n int, waiting, closed bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false, false
	}
	rc.Control(func(fd uintptr) {
		var err error
		n, _, err = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR):
			n = 0 // nothing waiting: still there
		case err != nil:
			n, closed = 0, true // reset
		case n == 0:
			closed = true // end of stream
		default:
			waiting = true
		}
	})
	return n, waiting, closed
}

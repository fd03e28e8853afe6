// Package patient holds what sluice's listeners share, whatever they serve:
// Listener, which waits out a flood instead of ending the server.
package patient

import (
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Listener wraps ln so that Accept outlasts what a flood of
// connections does to a process: out of file descriptors (EMFILE, ENFILE),
// buffers or memory, or a connection reset before it was accepted. It
// waits (5 ms, doubling up to 1 s) and accepts again, as net/http's server
// does, instead of returning the error, which would end a server's Serve
// and with it the process: fasthttp's server and sluice's gRPC server both
// stop on such an error. It logs at most once every 10 s.
func Listener(ln net.Listener, log *slog.Logger) net.Listener {
	if log == nil {
		log = slog.Default()
	}
	return &patientListener{Listener: ln, log: log}
}

type patientListener struct {
	net.Listener
	log    *slog.Logger
	logged atomic.Int64 // when a wait was last logged, ns
	waits  atomic.Int64 // waits since then
}

func (l *patientListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || !passing(err) {
			return c, err
		}
		backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
		l.waits.Add(1)
		if now := time.Now().UnixNano(); now-l.logged.Load() > int64(10*time.Second) {
			l.logged.Store(now)
			l.log.Warn("sluice: cannot accept connections for now; waiting", "error", err, "waits", l.waits.Swap(0), "listen", l.Addr().String())
		}
		time.Sleep(backoff)
	}
}

// passing reports whether an Accept error is one to wait out.
func passing(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

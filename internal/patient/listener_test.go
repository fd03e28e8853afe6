package patient

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
)

// fdStarved is a listener out of file descriptors for its first n Accepts.
type fdStarved struct {
	net.Listener
	n int
}

func (l *fdStarved) Accept() (net.Conn, error) {
	if l.n > 0 {
		l.n--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// Out of file descriptors, Accept waits and tries again instead of
// returning the error that would end the server; a closed listener's error
// still ends it.
func TestPatientListenerWaitsOutEMFILE(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl := Listener(&fdStarved{Listener: ln, n: 3}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
		}
	}()
	c, err := pl.Accept()
	if err != nil {
		t.Fatalf("Accept after three EMFILE: %v", err)
	}
	c.Close()
	ln.Close()
	if _, err := pl.Accept(); err == nil || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
}

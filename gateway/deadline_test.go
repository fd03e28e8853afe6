package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// scriptedConn is a connection whose deadlines are recorded and whose
// reads and writes fail with a deadline's error when the script says so:
// what lazyConn does with the socket beneath it, without waiting.
type scriptedConn struct {
	net.Conn
	readArmed, writeArmed time.Time
	arms                  int
	readTimeouts          int // reads that fail first, as if the armed deadline passed
	writeTimeouts         int // writes that write half, then fail so
	wrote                 bytes.Buffer
}

func (c *scriptedConn) SetReadDeadline(t time.Time) error  { c.readArmed = t; c.arms++; return nil }
func (c *scriptedConn) SetWriteDeadline(t time.Time) error { c.writeArmed = t; c.arms++; return nil }

func (c *scriptedConn) Read(b []byte) (int, error) {
	if c.readTimeouts > 0 {
		c.readTimeouts--
		return 0, &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}
	}
	return copy(b, "data"), nil
}

func (c *scriptedConn) Write(b []byte) (int, error) {
	if c.writeTimeouts > 0 {
		c.writeTimeouts--
		n, _ := c.wrote.Write(b[:len(b)/2])
		return n, &net.OpError{Op: "write", Err: os.ErrDeadlineExceeded}
	}
	return c.wrote.Write(b)
}

// The invariant, on random deadlines asked in random order: the armed
// deadline is never later than the one asked for, and there is one when
// one is asked for.
func TestLazyDeadlineIsNeverLaterThanAsked(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := time.Now()
	sc := &scriptedConn{}
	c := &lazyConn{Conn: sc}
	for i := range 20000 {
		var d time.Time // zero: no deadline
		if r.IntN(6) != 0 {
			d = base.Add(time.Duration(r.IntN(200)-20) * time.Second)
		}
		switch r.IntN(3) {
		case 0:
			c.SetReadDeadline(d)
		case 1:
			c.SetWriteDeadline(d)
		default:
			c.SetDeadline(d)
		}
		for _, s := range []struct {
			dir          string
			asked, armed time.Time
		}{{"read", c.read.asked, sc.readArmed}, {"write", c.write.asked, sc.writeArmed}} {
			if !s.asked.IsZero() && (s.armed.IsZero() || s.armed.After(s.asked)) {
				t.Fatalf("step %d: %s deadline asked %v, armed %v", i, s.dir, s.asked.Sub(base), s.armed.Sub(base))
			}
		}
	}
}

// fasthttp's server asks three deadlines a request, the idle wait, the
// read and the write, each later than the last: on a busy connection the
// socket's are armed once per timeout, not three times a request.
func TestLazyDeadlinesArmTheSocketOncePerTimeout(t *testing.T) {
	sc := &scriptedConn{}
	c := &lazyConn{Conn: sc}
	now := time.Now()
	for i := range 1000 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		c.SetReadDeadline(at.Add(2 * time.Minute)) // idle
		c.SetReadDeadline(at.Add(30 * time.Second))
		c.SetWriteDeadline(at.Add(30 * time.Second))
	}
	if sc.arms != 3 { // the first idle wait, its read, its write
		t.Fatalf("the socket's deadlines were armed %d times for 1,000 requests, want 3", sc.arms)
	}
	// None asked: the armed one stays, a false alarm clears it.
	c.SetReadDeadline(time.Time{})
	sc.readTimeouts = 1
	if n, err := c.Read(make([]byte, 8)); n != 4 || err != nil {
		t.Fatalf("a read with no deadline asked, after a false alarm: %d, %v", n, err)
	}
	if !sc.readArmed.IsZero() {
		t.Fatalf("after a false alarm with no deadline asked, the socket's is %v", sc.readArmed)
	}
}

// A read or write stopped by the armed deadline before the one asked for
// goes on, the write where it stopped; one stopped by its own deadline
// fails.
func TestLazyDeadlineFalseAlarmsAreInvisible(t *testing.T) {
	sc := &scriptedConn{}
	c := &lazyConn{Conn: sc}
	soon, later := time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
	c.SetDeadline(soon)
	c.SetDeadline(later)
	if !sc.readArmed.Equal(soon) || !sc.writeArmed.Equal(soon) {
		t.Fatalf("armed %v and %v, want the sooner deadline kept", sc.readArmed, sc.writeArmed)
	}
	sc.readTimeouts, sc.writeTimeouts = 2, 3
	if n, err := c.Read(make([]byte, 8)); n != 4 || err != nil {
		t.Fatalf("read after false alarms: %d, %v", n, err)
	}
	msg := []byte("a response of some length, written in parts")
	if n, err := c.Write(msg); n != len(msg) || err != nil || !bytes.Equal(sc.wrote.Bytes(), msg) {
		t.Fatalf("write after false alarms: %d, %v, wrote %q", n, err, sc.wrote.Bytes())
	}
	if !sc.readArmed.Equal(later) || !sc.writeArmed.Equal(later) {
		t.Fatalf("after false alarms armed %v and %v, want the deadline asked", sc.readArmed, sc.writeArmed)
	}

	past := time.Now().Add(-time.Second)
	c.SetDeadline(past)
	if !sc.readArmed.Equal(past) {
		t.Fatalf("a sooner deadline was not armed")
	}
	sc.readTimeouts, sc.writeTimeouts = 1, 1
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read past its own deadline: %v, want the deadline's error", err)
	}
	sc.wrote.Reset()
	if n, err := c.Write(msg); n != len(msg)/2 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write past its own deadline: %d, %v, want half and the deadline's error", n, err)
	}
}

// On a real socket: a read whose deadline was moved later is still
// waiting when the first deadline passes, and gets the bytes that come
// after it.
func TestLazyDeadlineMovedLaterOnASocket(t *testing.T) {
	ln := loopbackListener(t)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		time.Sleep(150 * time.Millisecond)
		c.Write([]byte("late"))
		io.Copy(io.Discard, c)
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := &lazyConn{Conn: raw}
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	c.SetReadDeadline(time.Now().Add(time.Minute))
	b := make([]byte, 8)
	n, err := c.Read(b)
	if err != nil || string(b[:n]) != "late" {
		t.Fatalf("read %q, %v: want the bytes sent after the first deadline", b[:n], err)
	}
	// And its own deadline still ends a read.
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := c.Read(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read past its deadline: %v", err)
	}
}

// The plane's client timeouts hold with lazy deadlines: a client that
// stops halfway through its second request, or sends it a byte at a time,
// is cut off; a client idle past the idle timeout too. (The timeouts are
// shortened here: at the defaults, 30 s and 2 min, the test would wait
// that long.)
func TestFastPlaneClientTimeoutsHoldWithLazyDeadlines(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	g := NewFast(u, planeEngine(t, fastRules), Options{Logger: quietLog})
	g.server.ReadTimeout, g.server.WriteTimeout, g.server.IdleTimeout = 300*time.Millisecond, 300*time.Millisecond, 600*time.Millisecond
	ln := loopbackListener(t)
	go g.Serve(ln)
	t.Cleanup(func() { g.server.Shutdown() })

	cases := map[string]func(c net.Conn) error{
		"stops halfway": func(c net.Conn) error {
			_, err := c.Write([]byte("GET /b HTTP/1.1\r\nHost: x\r\n"))
			return err
		},
		"a byte at a time": func(c net.Conn) error {
			req := "GET /b HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 400) + "\r\n\r\n"
			for i := range len(req) {
				if _, err := c.Write([]byte{req[i]}); err != nil {
					return nil // cut off: what the test wants
				}
				time.Sleep(20 * time.Millisecond)
			}
			return errors.New("the whole request was sent a byte at a time, 20 ms apart, past a 300 ms read timeout")
		},
		"idle": func(net.Conn) error { return nil },
	}
	for name, second := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			// A first request, answered: the connection's deadlines have been
			// asked and moved on once.
			if _, err := c.Write([]byte("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			var resp fasthttp.Response
			if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
				t.Fatalf("first request: %v, %d", err, resp.StatusCode())
			}
			if err := second(c); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(20 * time.Second)) // the test's own bound, far past the plane's
			rest, err := io.ReadAll(br)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the plane kept the connection open (read %q)", rest)
			}
		})
	}
}

// BenchmarkDeadlinesOfARequest: the three deadlines fasthttp asks of a
// client connection per request (the idle wait, the read, the write), set
// on the socket itself and through a lazyConn.
func BenchmarkDeadlinesOfARequest(b *testing.B) {
	ln := loopbackListener(b)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			io.Copy(io.Discard, c)
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	for _, c := range []struct {
		name string
		conn net.Conn
	}{{"socket", raw}, {"lazy", &lazyConn{Conn: raw}}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				now := time.Now()
				c.conn.SetReadDeadline(now.Add(2 * time.Minute))
				c.conn.SetReadDeadline(now.Add(30 * time.Second))
				c.conn.SetWriteDeadline(now.Add(30 * time.Second))
			}
		})
	}
}

package h2grpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

var bidiDesc = &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}

// streamFixture is a server with streaming test methods.
type streamFixture struct {
	*fixture
	gate     chan struct{}        // /t.T/Lazy reads only once it is closed
	lazy     atomic.Pointer[bidi] // the running /t.T/Lazy call's state
	peak     atomic.Int64         // the most request bytes it held
	canceled chan error
}

func newStreamFixture(t *testing.T) *streamFixture {
	sf := &streamFixture{gate: make(chan struct{}), canceled: make(chan error, 4)}
	sf.fixture = newFixture(t, func(s *Server) {
		s.Streams = map[string]StreamMethod{
			"/t.T/EchoStream": func(_ context.Context, st *Stream) error {
				for {
					m, err := st.Recv()
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					if err := st.Send(m); err != nil {
						return err
					}
				}
			},
			"/t.T/Lazy": func(_ context.Context, st *Stream) error {
				sf.lazy.Store(st.st.bidi)
				<-sf.gate
				n := 0
				for {
					_, err := st.Recv()
					if err == io.EOF {
						return st.Send(fmt.Appendf(nil, "%d", n))
					}
					if err != nil {
						return err
					}
					n++
				}
			},
			"/t.T/FailLate": func(_ context.Context, st *Stream) error {
				st.Send([]byte("one"))
				return grpcstatus.Error(codes.PermissionDenied, "no more")
			},
			"/t.T/PanicStream": func(context.Context, *Stream) error { panic("boom") },
			"/t.T/Wait": func(ctx context.Context, st *Stream) error {
				for {
					if _, err := st.Recv(); err != nil {
						sf.canceled <- err
						return err
					}
					st.Send([]byte("got it"))
				}
			},
		}
	})
	return sf
}

func TestAStreamMethodAnswersEachMessageInOrder(t *testing.T) {
	f := newStreamFixture(t)
	cs, err := f.client(t).NewStream(context.Background(), bidiDesc, "/t.T/EchoStream")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		req := bytes.Repeat([]byte{byte(i)}, i%5000)
		if err := cs.SendMsg(&req); err != nil {
			t.Fatal(err)
		}
		var resp []byte
		if err := cs.RecvMsg(&resp); err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("message %d: %d bytes back for %d, %v", i, len(resp), len(req), err)
		}
	}
	cs.CloseSend()
	var resp []byte
	if err := cs.RecvMsg(&resp); err != io.EOF {
		t.Fatalf("after the client's end: %v, want the call to end OK", err)
	}
}

// A method that does not read stops its client at the stream's window: the
// server holds no more than the window, and once the method reads, every
// message arrives.
func TestAStreamMethodThatDoesNotReadHoldsNoMoreThanItsWindow(t *testing.T) {
	t.Run("large messages", func(t *testing.T) { lazyReader(t, 200, 32<<10) })
	// Many small ones wait in the buffer; each taken does not copy the rest.
	t.Run("small messages", func(t *testing.T) { lazyReader(t, 60_000, 8) })
}

func lazyReader(t *testing.T, n, size int) {
	f := newStreamFixture(t)
	cs, err := f.client(t).NewStream(context.Background(), bidiDesc, "/t.T/Lazy")
	if err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	done := make(chan error, 1)
	go func() {
		msg := bytes.Repeat([]byte("x"), size)
		for range n {
			if err := cs.SendMsg(&msg); err != nil {
				done <- err
				return
			}
			sent.Add(1)
		}
		done <- cs.CloseSend()
	}()
	var b *bidi
	waitUntil(t, "the method's call", func() bool { b = f.lazy.Load(); return b != nil })
	var window int64
	waitUntil(t, "the stream window filled", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		window = b.granted
		return b.recvd >= min(window-int64(size)-5, int64(n*(size+5))-64<<10)
	})
	b.mu.Lock()
	held := b.held
	b.mu.Unlock()
	if held > window {
		t.Fatalf("the server holds %d request bytes of a method that does not read, past the window of %d", held, window)
	}
	if sent.Load() == int64(n) && int64(n*(size+5)) > window {
		t.Fatalf("all %d messages were taken while the method read none", n)
	}
	close(f.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var resp []byte
	if err := cs.RecvMsg(&resp); err != nil || string(resp) != fmt.Sprint(n) {
		t.Fatalf("the method read %q (%v), want %d messages", resp, err, n)
	}
}

func TestAStreamMethodsErrorAndPanicEndTheCallWithAStatus(t *testing.T) {
	f := newStreamFixture(t)
	cc := f.client(t)
	cs, _ := cc.NewStream(context.Background(), bidiDesc, "/t.T/FailLate")
	var resp []byte
	if err := cs.RecvMsg(&resp); err != nil || string(resp) != "one" {
		t.Fatalf("first message: %q %v", resp, err)
	}
	if err := cs.RecvMsg(&resp); grpcstatus.Code(err) != codes.PermissionDenied || grpcstatus.Convert(err).Message() != "no more" {
		t.Fatalf("after the message: %v, want PermissionDenied \"no more\"", err)
	}
	cs, _ = cc.NewStream(context.Background(), bidiDesc, "/t.T/PanicStream")
	if err := cs.RecvMsg(&resp); grpcstatus.Code(err) != codes.Internal || f.panics.Load() != 1 {
		t.Fatalf("a panicking method: %v (%d panics told), want Internal", err, f.panics.Load())
	}
}

func TestAClientsResetEndsTheStreamMethodsWait(t *testing.T) {
	f := newStreamFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := f.client(t).NewStream(ctx, bidiDesc, "/t.T/Wait")
	if err != nil {
		t.Fatal(err)
	}
	m := []byte("hello")
	cs.SendMsg(&m)
	var resp []byte
	if err := cs.RecvMsg(&resp); err != nil { // the method is waiting for the next
		t.Fatal(err)
	}
	cancel() // RST_STREAM for the calls still open
	select {
	case err := <-f.canceled:
		if err == nil || errors.Is(err, io.EOF) {
			t.Fatalf("after the reset the method's Recv returned %v, want the call's end", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the method still waited 20 s after the client reset the stream")
	}
}

func waitUntil(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in 30 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Long-lived streaming calls count against MaxOpenStreams, not
// MaxOpenCalls: many of them held open leave the unary calls their room,
// and past their own bound a new one is refused.
func TestStreamsHeldOpenLeaveUnaryCallsTheirRoom(t *testing.T) {
	sf := &streamFixture{gate: make(chan struct{}), canceled: make(chan error, 64)}
	sf.fixture = newFixture(t, func(s *Server) {
		s.MaxOpenCalls, s.MaxOpenStreams = 8, 24
		s.Streams = map[string]StreamMethod{"/t.T/Wait": func(ctx context.Context, st *Stream) error {
			for {
				if _, err := st.Recv(); err != nil {
					return err
				}
			}
		}}
	})
	holder := sf.client(t) // one connection holds the streams
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []grpc.ClientStream
	for range 24 {
		cs, err := holder.NewStream(ctx, bidiDesc, "/t.T/Wait")
		if err != nil {
			t.Fatal(err)
		}
		m := []byte("x")
		cs.SendMsg(&m)
		open = append(open, cs)
	}
	waitUntil(t, "24 streams running", func() bool { return sf.s.openStreams.Load() == 24 })
	// The 25th is refused.
	cs, err := holder.NewStream(ctx, bidiDesc, "/t.T/Wait")
	if err == nil {
		var resp []byte
		err = cs.RecvMsg(&resp)
	}
	if grpcstatus.Code(err) != codes.Unavailable {
		t.Fatalf("a stream past MaxOpenStreams: %v, want refused (REFUSED_STREAM, Unavailable to grpc-go)", err)
	}
	// Unary calls on another connection, 16 at once, all answered.
	other := sf.client(t)
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			_, err := invoke(context.Background(), other, "/t.T/Echo", []byte{byte(i)})
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatalf("a unary call beside 24 open streams: %v", err)
		}
	}
	_ = open
}

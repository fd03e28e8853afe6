package h2grpc

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
)

// rawCodec passes messages as they are, so that a grpc-go client can call
// methods that echo bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// fixture is a server on loopback with test methods.
type fixture struct {
	s       *Server
	addr    string
	panics  atomic.Int32
	release chan struct{} // ends /t.T/Hold calls
	running atomic.Int32  // /t.T/Hold calls running
	maxRun  atomic.Int32
	sawDone chan struct{} // a /t.T/Block call saw its context end
}

func newFixture(t *testing.T, configure func(*Server)) *fixture {
	t.Helper()
	f := &fixture{release: make(chan struct{}), sawDone: make(chan struct{}, 16)}
	f.s = &Server{
		Methods: map[string]Method{
			"/t.T/Echo": func(_ context.Context, req, out []byte) ([]byte, error) { return append(out, req...), nil },
			"/t.T/Fail": func(context.Context, []byte, []byte) ([]byte, error) {
				return nil, grpcstatus.Error(codes.InvalidArgument, "naïve 100% wrong\nsecond line")
			},
			"/t.T/Panic": func(context.Context, []byte, []byte) ([]byte, error) { panic("boom") },
			"/t.T/Deadline": func(ctx context.Context, _, out []byte) ([]byte, error) {
				d, ok := ctx.Deadline()
				if !ok {
					return nil, grpcstatus.Error(codes.FailedPrecondition, "no deadline")
				}
				return fmt.Appendf(out, "%d", time.Until(d).Milliseconds()), nil
			},
			"/t.T/Block": func(ctx context.Context, _, out []byte) ([]byte, error) {
				<-ctx.Done()
				f.sawDone <- struct{}{}
				return nil, ctx.Err()
			},
			"/t.T/Hold": func(_ context.Context, _, out []byte) ([]byte, error) {
				n := f.running.Add(1)
				for m := f.maxRun.Load(); n > m && !f.maxRun.CompareAndSwap(m, n); m = f.maxRun.Load() {
				}
				<-f.release
				f.running.Add(-1)
				return append(out, "held"...), nil
			},
			"/t.T/Big": func(_ context.Context, req, out []byte) ([]byte, error) {
				return append(out, bytes.Repeat(req, 1<<20/max(len(req), 1))...), nil
			},
		},
		OnPanic: func(string, any) { f.panics.Add(1) },
	}
	if configure != nil {
		configure(f.s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	go f.s.Serve(ln)
	t.Cleanup(func() { f.s.Close() })
	return f
}

func (f *fixture) client(t *testing.T) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func invoke(ctx context.Context, cc *grpc.ClientConn, method string, req []byte) ([]byte, error) {
	var resp []byte
	err := cc.Invoke(ctx, method, &req, &resp)
	return resp, err
}

// TestConcurrentCallsGetTheirOwnAnswers: 64 callers on one connection, each
// answer is its own request's, including empty and multi-frame messages.
func TestConcurrentCallsGetTheirOwnAnswers(t *testing.T) {
	f := newFixture(t, nil)
	cc := f.client(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Go(func() {
			for i := range 100 {
				req := bytes.Repeat([]byte(fmt.Sprintf("g%d-i%d;", g, i)), (g*i)%3000)
				resp, err := invoke(context.Background(), cc, "/t.T/Echo", req)
				if err != nil || !bytes.Equal(resp, req) {
					errs <- fmt.Errorf("caller %d call %d: %d bytes back for %d, err %v", g, i, len(resp), len(req), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestStatuses: errors, unknown methods, panics and oversized messages are
// answered with the gRPC status grpc-go would give.
func TestStatuses(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxRecvMsgSize = 1000 })
	cc := f.client(t)
	ctx := context.Background()
	cases := []struct {
		method string
		req    []byte
		code   codes.Code
		msg    string
	}{
		{"/t.T/Fail", nil, codes.InvalidArgument, "naïve 100% wrong\nsecond line"},
		{"/t.T/Nope", nil, codes.Unimplemented, "unknown method /t.T/Nope"},
		{"/t.T/Panic", nil, codes.Internal, "the server could not answer this call"},
		{"/t.T/Echo", make([]byte, 1001), codes.ResourceExhausted, "request message larger than 1000 bytes"},
		{"/t.T/Deadline", nil, codes.FailedPrecondition, "no deadline"},
	}
	for _, c := range cases {
		_, err := invoke(ctx, cc, c.method, c.req)
		if s := grpcstatus.Convert(err); s.Code() != c.code || s.Message() != c.msg {
			t.Errorf("%s: got %v %q, want %v %q", c.method, s.Code(), s.Message(), c.code, c.msg)
		}
	}
	if f.panics.Load() != 1 {
		t.Errorf("OnPanic told of %d panics, want 1", f.panics.Load())
	}
	// The connection survived all of it.
	if resp, err := invoke(ctx, cc, "/t.T/Echo", make([]byte, 1000)); err != nil || len(resp) != 1000 {
		t.Fatalf("a call of the largest message after the errors: %d bytes, %v", len(resp), err)
	}
}

// TestDeadlineAndCancel: grpc-timeout is the method's deadline; a client
// that gives up (RST_STREAM) cancels the method's context.
func TestDeadlineAndCancel(t *testing.T) {
	f := newFixture(t, nil)
	cc := f.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	resp, err := invoke(ctx, cc, "/t.T/Deadline", nil)
	var ms int
	if _, serr := fmt.Sscan(string(resp), &ms); err != nil || serr != nil || ms <= 0 || ms > 30000 {
		t.Fatalf("the method's deadline was %q ms away (%v), want within the client's 30 s", resp, err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := invoke(cctx, cc, "/t.T/Block", nil); done <- err }()
	time.Sleep(50 * time.Millisecond) // let the call reach the method; a late cancel still works
	ccancel()
	select {
	case <-f.sawDone:
	case <-time.After(patience):
		t.Fatal("the method's context never ended after the client cancelled")
	}
	if err := <-done; grpcstatus.Code(err) != codes.Canceled {
		t.Fatalf("the client's call ended with %v, want Canceled", err)
	}
}

// TestLargeAnswersFollowFlowControl: 1 MiB answers, far beyond a grpc-go
// client's initial windows, arrive whole, concurrently.
func TestLargeAnswersFollowFlowControl(t *testing.T) {
	f := newFixture(t, nil)
	cc := f.client(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			req := make([]byte, 64)
			rand.Read(req)
			resp, err := invoke(context.Background(), cc, "/t.T/Big", req)
			if err != nil || len(resp) != 1<<20 || !bytes.Equal(resp[len(resp)-64:], req) {
				t.Errorf("caller %d: %d bytes, %v", g, len(resp), err)
			}
		})
	}
	wg.Wait()
}

// TestShutdownFinishesCallsInFlight: Shutdown waits for a call already
// taken, refuses new ones, and returns once it is answered.
func TestShutdownFinishesCallsInFlight(t *testing.T) {
	// Answers are slow to be written once their calls end: Shutdown must
	// wait for them, not only for the calls.
	testHookBeforeAnswer = func() { time.Sleep(20 * time.Millisecond) }
	defer func() { testHookBeforeAnswer = nil }()
	f := newFixture(t, nil)
	cc := f.client(t)
	// 64 calls in flight, answered all at once as Shutdown starts: each
	// must get its answer before the connection closes.
	held := make(chan error, 64)
	for range 64 {
		go func() { _, err := invoke(context.Background(), cc, "/t.T/Hold", nil); held <- err }()
	}
	for f.running.Load() < 64 {
		time.Sleep(time.Millisecond)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
		defer cancel()
		shut <- f.s.Shutdown(ctx)
	}()
	// A new call is not served: the connection is going away and the
	// listener is closed.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for {
		_, err := invoke(ctx, cc, "/t.T/Echo", []byte("late"))
		if err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // the GOAWAY may not have arrived yet
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a call in flight", err)
	default:
	}
	close(f.release)
	for range 64 {
		if err := <-held; err != nil {
			t.Fatalf("a call in flight: %v", err)
		}
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(f.s.Serve(ln), ErrServerClosed) {
		t.Fatal("Serve after Shutdown did not return ErrServerClosed")
	}
}

// A connection forgets each stream once answered: its table of streams
// does not grow with the calls it serves.
func TestAnsweredStreamsAreForgotten(t *testing.T) {
	f := newFixture(t, nil)
	cc := f.client(t)
	for i := range 20 {
		if _, err := invoke(context.Background(), cc, "/t.T/Echo", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if len(f.s.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(f.s.conns))
	}
	for c := range f.s.conns {
		c.mu.Lock()
		n := len(c.streams)
		c.mu.Unlock()
		if n != 0 {
			t.Fatalf("%d streams remembered after 20 calls answered, want 0", n)
		}
	}
}

// TestWorkersAreBoundedAndReused: a call with no idle worker starts one, up
// to maxWorkers; the worker then serves the next calls.
func TestWorkersAreBoundedAndReused(t *testing.T) {
	f := newFixture(t, nil)
	f.s.nworkers.Store(maxWorkers - 1) // as if 255 were busy
	cc := f.client(t)
	for i := range 5 {
		if _, err := invoke(context.Background(), cc, "/t.T/Echo", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if n := f.s.nworkers.Load(); n != maxWorkers {
			t.Fatalf("after call %d: %d workers counted, want %d (one started, then reused)", i+1, n, maxWorkers)
		}
	}
}

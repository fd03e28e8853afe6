package grpclimit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/grpclimit"
)

// counted serves src behind the interceptors and counts the calls that
// reached the server and those it refused; the client side uses c.
func counted(t *testing.T, src string, c *grpclimit.Client) (*grpc.ClientConn, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	e := engineOf(t, src)
	var calls, refused atomic.Int64
	count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		resp, err := h(ctx, req)
		if status.Code(err) == codes.ResourceExhausted {
			refused.Add(1)
		}
		return resp, err
	}
	conn := served(t, grpc.NewServer(grpc.ChainUnaryInterceptor(count, grpclimit.New(e, grpclimit.Options{}).UnaryServerInterceptor())), grpc.WithUnaryInterceptor(c.UnaryClientInterceptor()), grpc.WithStreamInterceptor(c.StreamClientInterceptor()))
	return conn, &calls, &refused
}

// A refused call is waited out as the server asks and then succeeds;
// retries stay within the budget, so many callers make no storm.
func TestTheClientWaitsAsTheServerAsks(t *testing.T) {
	c := &grpclimit.Client{}
	c.Transport.NoPacing = true // the waits here are the retries'
	// One every 3 s: the second call, made at once, is refused for about 3 s
	// however busy the machine.
	conn, calls, refused := counted(t, "rules:\n  - {id: r, key: [ip], rate: 1, per: 3s, burst: 1}\n", c)
	start := time.Now()
	for i := range 2 {
		if err := check(context.Background(), conn); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	if refused.Load() == 0 {
		t.Fatal("no call was refused: the test shows nothing")
	}
	if calls.Load() != 2+refused.Load() || refused.Load() > 1 {
		t.Fatalf("2 calls took %d attempts, %d refused: want one refusal, waited out once", calls.Load(), refused.Load())
	}
	t.Logf("2 calls, %d refused and retried, in %v", refused.Load(), time.Since(start).Round(time.Millisecond))
}

// A wait past the call's deadline is not made: the refusal is answered at
// once, by the server (a RetryInfo an hour long), or without sending (the
// pace learnt from the RateLimit metadata, an hour away).
func TestTheClientDoesNotWaitPastTheDeadline(t *testing.T) {
	for _, c := range []struct {
		noPacing bool
		sent     int64
	}{{true, 2}, {false, 1}} {
		cl := &grpclimit.Client{}
		cl.Transport.NoPacing = c.noPacing
		conn, calls, _ := counted(t, "rules:\n  - {id: r, key: [ip], rate: 1, per: 1h}\n", cl)
		if err := check(context.Background(), conn); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := check(ctx, conn)
		if status.Code(err) != codes.ResourceExhausted || ctx.Err() != nil {
			t.Fatalf("pacing %v, a refusal an hour long: %v (context %v), want ResourceExhausted at once", !c.noPacing, err, ctx.Err())
		}
		cancel()
		if calls.Load() != c.sent {
			t.Fatalf("pacing %v: %d calls reached the server, want %d", !c.noPacing, calls.Load(), c.sent)
		}
	}
}

// With pacing, callers that learnt their quota is spent wait for it
// before they send, where callers without pacing are refused and retry:
// 8 callers of one client making 48 calls at 16 a second are refused far
// less often paced.
func TestTheClientPacesByTheRateLimitMetadata(t *testing.T) {
	refusedWith := func(noPacing bool) int64 {
		c := &grpclimit.Client{}
		c.Transport.NoPacing = noPacing
		c.Transport.BudgetTokens = 1000 // the retries' budget is another test's
		conn, _, refused := counted(t, "rules:\n  - {id: r, key: [ip], rate: 16, per: 1s}\n", c)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 6 {
					if err := check(context.Background(), conn); err != nil {
						t.Errorf("a call: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		return refused.Load()
	}
	paced, unpaced := refusedWith(false), refusedWith(true)
	t.Logf("8 callers, 48 calls at 16 a second: %d refused paced, %d unpaced", paced, unpaced)
	if 2*paced >= unpaced {
		t.Fatalf("48 calls at 16 a second: %d refused with pacing, %d without; want fewer than half", paced, unpaced)
	}
}

// A server-streaming call refused before its first message is opened again
// after the wait and gets its messages; a refusal longer than MaxDelay is
// the caller's.
func TestAServerStreamRefusedAtOpenIsOpenedAgain(t *testing.T) {
	e := engineOf(t, "rules:\n  - {id: r, key: [ip], rate: 1, per: 3s, burst: 1}\n")
	var opened atomic.Int64
	countStreams := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		opened.Add(1)
		return h(srv, ss)
	}
	c := &grpclimit.Client{}
	c.Transport.NoPacing = true
	conn := served(t, grpc.NewServer(grpc.ChainStreamInterceptor(countStreams, grpclimit.New(e, grpclimit.Options{}).StreamServerInterceptor())),
		grpc.WithStreamInterceptor(c.StreamClientInterceptor()))
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("stream %d: %v", i+1, err)
		}
		cancel()
	}
	if opened.Load() != 3 {
		t.Fatalf("%d streams opened at the server, want 3 (the second refused once, then opened again)", opened.Load())
	}
}

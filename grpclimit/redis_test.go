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

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/grpclimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// Two gRPC servers, each with its own engine and its own connection to one
// real Redis, share one limit exactly: 64 callers spread over both make
// 1,000 calls for one user limited to 100. The rule waits for a slow store
// (onSlowStore: wait) rather than answering from the server's share, so
// that a busy machine (this test under -race beside others) makes no call
// miss its deadline into a degraded answer.
func TestTwoServersOnRedisShareOneLimitExactly(t *testing.T) {
	url := redistest.Start(t).URL()
	var conns []*grpc.ClientConn
	for range 2 {
		cfg, err := rules.Parse("t.yaml", []byte("rules:\n  - {id: per-user, key: [user], rate: 100, per: 1h, onSlowStore: wait}\n"))
		if err != nil {
			t.Fatal(err)
		}
		store, err := redis.New(redis.Options{URL: url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(store.Close)
		e, err := engine.New(cfg, engine.Options{Store: store, Fallback: memory.New(), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		conn := served(t, grpc.NewServer(grpc.UnaryInterceptor(grpclimit.New(e, grpclimit.Options{}).UnaryServerInterceptor())))
		conns = append(conns, conn)
	}
	var ok, refused, left atomic.Int64
	left.Store(1000)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for n := left.Add(-1); n >= 0; n = left.Add(-1) {
				err := check(withUser("shared"), conns[(int(n)+i)%2])
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.ResourceExhausted:
					refused.Add(1)
				default:
					t.Errorf("a call: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() != 100 || refused.Load() != 900 {
		t.Fatalf("1,000 calls over two servers on one Redis, limit 100: %d admitted, %d refused", ok.Load(), refused.Load())
	}
}

// A store that does not answer is answered by each rule's fail mode, as on
// HTTP: a fail-closed rule refuses Unavailable with RetryInfo, a fail-open
// one admits within the gateway's share.
func TestAFailedStoreIsAnsweredByEachRulesFailMode(t *testing.T) {
	srv := redistest.Start(t)
	cfg, err := rules.Parse("t.yaml", []byte(`
rules:
  - {id: closed, match: {path: /grpc.health.v1.Health/Check}, key: [user], rate: 100, per: 1h, failMode: closed}
  - {id: open, match: {path: /grpc.health.v1.Health/Watch}, key: [user], rate: 100, per: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	store, err := redis.New(redis.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e, err := engine.New(cfg, engine.Options{Store: store, Fallback: memory.New(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l := grpclimit.New(e, grpclimit.Options{})
	conn := served(t, grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServerInterceptor()), grpc.StreamInterceptor(l.StreamServerInterceptor())))
	srv.Stop()
	err = check(withUser("u"), conn)
	if st := status.Convert(err); st.Code() != codes.Unavailable || len(st.Details()) == 0 {
		t.Fatalf("a fail-closed rule without its store: %v, want Unavailable with RetryInfo", err)
	}
	ctx, cancel := context.WithTimeout(withUser("u"), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("a fail-open rule without its store: %v, want the stream admitted", err)
	}
}

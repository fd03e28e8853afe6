package rlqs

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/testkit/rlqstest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A quota test: the service on a real grpc-go server on a loopback port,
// its engine on the embedded store, both on one manual clock, and Envoys
// played by rlqstest over go-control-plane's generated client. A fleet test
// has several services (processes) on one engine, each its own server,
// sharing a memFleet.
type quotaTest struct {
	t     *testing.T
	clock *sluice.ManualClock
	svc   *Service // the first
	conn  *grpc.ClientConn
	svcs  []*Service
	conns []*grpc.ClientConn
	all   []*rlqstest.Envoy
	lost  int64 // responses sent to streams as they ended
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newQuotaTest(t *testing.T, ruleFile string, o Options) *quotaTest {
	return newFleetTest(t, ruleFile, o, 1)
}

func newFleetTest(t *testing.T, ruleFile string, o Options, processes int) *quotaTest {
	t.Helper()
	cfg, err := rules.Parse("quota.yaml", []byte(ruleFile))
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	e, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	o.Engine, o.Clock, o.Logger = e, clock, quiet
	if processes > 1 {
		o.Fleet = &memFleet{clock: clock, claims: map[string]map[string]memClaim{}}
	}
	q := &quotaTest{t: t, clock: clock}
	for range processes {
		svc, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		svc.Register(g)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go g.Serve(ln)
		t.Cleanup(g.Stop)
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		q.svcs, q.conns = append(q.svcs, svc), append(q.conns, conn)
	}
	q.svc, q.conn = q.svcs[0], q.conns[0]
	return q
}

// stats sums the services' counts.
func (q *quotaTest) stats() Stats {
	var sum Stats
	for _, s := range q.svcs {
		st := s.Stats()
		sum.Streams += st.Streams
		sum.Subscriptions += st.Subscriptions
		sum.Pending += st.Pending
		sum.Reports += st.Reports
		sum.Responses += st.Responses
		sum.Unpaid += st.Unpaid
	}
	return sum
}

// memFleet is the processes' claims in memory, as the Redis store keeps
// them, on the test's clock.
type memFleet struct {
	mu     sync.Mutex
	clock  sluice.Clock
	claims map[string]map[string]memClaim
}

type memClaim struct {
	claim  float64
	expiry int64
}

func (f *memFleet) Claims(_ context.Context, bucket, id string, claim float64, ttl time.Duration) ([]float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	m := f.claims[bucket]
	if m == nil {
		m = map[string]memClaim{}
		f.claims[bucket] = m
	}
	m[id] = memClaim{claim, now + int64(ttl)}
	var others []float64
	for other, c := range m {
		if other != id && c.expiry > now {
			others = append(others, c.claim)
		}
	}
	return others, nil
}

func (q *quotaTest) envoy(name, domain string, bucket map[string]string) *rlqstest.Envoy {
	return q.envoyOn(0, name, domain, bucket)
}

// envoyOn is an Envoy whose stream goes to process i.
func (q *quotaTest) envoyOn(i int, name, domain string, bucket map[string]string) *rlqstest.Envoy {
	e, err := rlqstest.New(q.conns[i], q.clock, name, domain, bucket)
	if err != nil {
		q.t.Fatal(err)
	}
	q.t.Cleanup(e.Leave)
	q.all = append(q.all, e)
	return e
}

// leave ends e's stream once the service has answered all it was sent;
// the filter keeps enforcing what it was assigned until the TTL ends.
func (q *quotaTest) leave(e *rlqstest.Envoy) {
	q.settle()
	e.Leave()
	open := int64(0)
	for _, o := range q.all {
		if !o.Closed() {
			open++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for q.stats().Streams != open {
		if time.Now().After(deadline) {
			q.t.Fatalf("the service still counts %s's stream", e.Name)
		}
		time.Sleep(time.Millisecond)
	}
	// What was sent to the stream as it ended is lost with it.
	q.lost = int64(q.stats().Responses) - q.received()
}

func (q *quotaTest) received() int64 {
	n := int64(0)
	for _, e := range q.all {
		n += e.Received()
	}
	return n
}

// settle waits until the service has taken every report sent and every
// Envoy has applied every response sent: the event every step waits on.
func (q *quotaTest) settle() {
	q.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sent := int64(0)
		for _, e := range q.all {
			sent += e.Sent()
		}
		st := q.stats()
		if st.Pending == 0 && int64(st.Reports) == sent && int64(st.Responses) == q.received()+q.lost {
			return
		}
		if time.Now().After(deadline) {
			q.t.Fatalf("not settled in 30 s: %+v, %d reports sent, %d responses applied", st, sent, q.received())
		}
		time.Sleep(time.Millisecond)
	}
}

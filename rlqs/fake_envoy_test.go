package rlqs

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A quota test: the service on a real grpc-go server on a loopback port,
// its engine on the embedded store, both on one manual clock, and Envoys
// played by fakeEnvoy over go-control-plane's generated client.
type quotaTest struct {
	t     *testing.T
	clock *sluice.ManualClock
	svc   *Service
	conn  *grpc.ClientConn
	all   []*fakeEnvoy
	lost  int64 // responses sent to streams as they ended
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newQuotaTest(t *testing.T, ruleFile string, o Options) *quotaTest {
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
	return &quotaTest{t: t, clock: clock, svc: svc, conn: conn}
}

// fakeEnvoy plays Envoy's rate limit quota filter for one bucket as its
// documentation describes it: no assignment or an expired one falls back to
// DENY_ALL (the setting sluice's docs ask for); a token bucket assignment
// starts full at max_tokens and fills continuously at tokens_per_fill per
// fill_interval; an identical assignment only extends the TTL, a different
// one replaces the bucket; usage (allowed and denied) is reported with the
// time elapsed since the last report; the first report names the domain.
type fakeEnvoy struct {
	q      *quotaTest
	name   string
	domain string
	id     *rlqsv3.BucketId
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc

	mu       sync.Mutex
	strategy *typev3.RateLimitStrategy
	expires  int64
	tokens   float64
	maxTok   float64
	rate     float64
	last     int64
	fills    []fillAt // each time a bucket started full
	admitted []int64
	allowed  uint64
	denied   uint64
	lastRep  int64
	reported bool
	closed   bool
	err      error

	sent     atomic.Int64 // reports sent
	received atomic.Int64 // responses applied
}

type fillAt struct {
	at     int64
	tokens float64
}

func (q *quotaTest) envoy(name, domain string, bucket map[string]string) *fakeEnvoy {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(q.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		q.t.Fatal(err)
	}
	e := &fakeEnvoy{q: q, name: name, domain: domain, id: &rlqsv3.BucketId{Bucket: bucket}, stream: stream, cancel: cancel}
	go e.receive()
	q.all = append(q.all, e)
	q.t.Cleanup(cancel)
	return e
}

func (e *fakeEnvoy) receive() {
	for {
		resp, err := e.stream.Recv()
		if err != nil {
			e.mu.Lock()
			e.err = err
			e.mu.Unlock()
			return
		}
		now := e.q.clock.Now()
		e.mu.Lock()
		for _, a := range resp.GetBucketAction() {
			if !proto.Equal(a.GetBucketId(), e.id) {
				continue
			}
			if qa := a.GetQuotaAssignmentAction(); qa != nil {
				e.assign(qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive().AsDuration(), now)
			} else {
				e.strategy, e.expires = nil, 0
			}
		}
		e.mu.Unlock()
		e.received.Add(1)
	}
}

func (e *fakeEnvoy) assign(s *typev3.RateLimitStrategy, ttl time.Duration, now int64) {
	if e.strategy != nil && now < e.expires && proto.Equal(s, e.strategy) {
		e.expires = now + int64(ttl)
		return
	}
	e.strategy, e.expires = s, now+int64(ttl)
	if tb := s.GetTokenBucket(); tb != nil {
		perFill := 1.0
		if tb.GetTokensPerFill() != nil {
			perFill = float64(tb.GetTokensPerFill().GetValue())
		}
		e.maxTok, e.tokens, e.last = float64(tb.GetMaxTokens()), float64(tb.GetMaxTokens()), now
		e.rate = perFill / tb.GetFillInterval().AsDuration().Seconds()
		e.fills = append(e.fills, fillAt{now, e.maxTok})
	}
}

// request is one request through the filter at the clock's time.
func (e *fakeEnvoy) request() bool {
	now := e.q.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := false
	switch {
	case e.strategy == nil || now >= e.expires:
	case e.strategy.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL && e.strategy.GetTokenBucket() == nil:
		ok = e.strategy.GetStrategy() != nil
	case e.strategy.GetTokenBucket() != nil:
		e.tokens = min(e.maxTok, e.tokens+e.rate*time.Duration(now-e.last).Seconds())
		e.last = now
		if e.tokens >= 1 {
			e.tokens--
			ok = true
		}
	}
	if ok {
		e.allowed++
		e.admitted = append(e.admitted, now)
	} else {
		e.denied++
	}
	return ok
}

// report sends the usage since the last report.
func (e *fakeEnvoy) report() {
	now := e.q.clock.Now()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           e.id,
		NumRequestsAllowed: e.allowed,
		NumRequestsDenied:  e.denied,
	}}}
	if !e.reported {
		m.Domain = e.domain
		m.BucketQuotaUsages[0].TimeElapsed = durationpb.New(0)
	} else {
		m.BucketQuotaUsages[0].TimeElapsed = durationpb.New(time.Duration(now - e.lastRep))
	}
	e.reported, e.lastRep, e.allowed, e.denied = true, now, 0, 0
	e.mu.Unlock()
	if err := e.stream.Send(m); err != nil {
		e.q.t.Fatalf("%s: report: %v", e.name, err)
	}
	e.sent.Add(1)
}

// leave ends the stream once the service has answered all it was sent;
// the filter keeps enforcing what it was assigned until the assignment's
// TTL ends.
func (e *fakeEnvoy) leave() {
	q := e.q
	q.settle()
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	open := int64(0)
	for _, o := range q.all {
		if !o.closed {
			open++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for q.svc.Stats().Streams != open {
		if time.Now().After(deadline) {
			q.t.Fatalf("the service still counts %s's stream", e.name)
		}
		time.Sleep(time.Millisecond)
	}
	// What was sent to the stream as it ended is lost with it.
	q.lost = int64(q.svc.Stats().Responses) - q.received()
}

func (q *quotaTest) received() int64 {
	n := int64(0)
	for _, e := range q.all {
		n += e.received.Load()
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
			sent += e.sent.Load()
		}
		st := q.svc.Stats()
		if st.Pending == 0 && int64(st.Reports) == sent && int64(st.Responses) == q.received()+q.lost {
			return
		}
		if time.Now().After(deadline) {
			q.t.Fatalf("not settled in 30 s: %+v, %d reports sent, %d responses applied", st, sent, q.received())
		}
		time.Sleep(time.Millisecond)
	}
}

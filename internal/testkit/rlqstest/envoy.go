// Package rlqstest plays Envoy's rate limit quota filter against a Rate
// Limit Quota Service, for tests: one bucket per Envoy, enforced locally as
// the filter's documentation describes, on a clock the test chooses.
package rlqstest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Envoy is one Envoy's filter for one bucket: no assignment or an expired
// one falls back to DENY_ALL (the setting sluice's docs ask for); a token
// bucket assignment starts full at max_tokens and fills continuously at
// tokens_per_fill per fill_interval; an identical assignment only extends
// the TTL, a different one replaces the bucket; usage (allowed and denied)
// is reported with the time elapsed since the last report; the first
// report names the domain. An abandoned bucket falls back.
type Envoy struct {
	Name   string
	clock  sluice.Clock
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
	fills    []Fill
	admitted []int64
	allowed  uint64
	denied   uint64
	lastRep  int64
	reported bool
	closed   bool
	err      error

	sent     atomic.Int64
	received atomic.Int64
}

// A Fill is a bucket handed out full: when, and its max_tokens.
type Fill struct {
	At     int64
	Tokens float64
}

// New opens the Envoy's stream on conn.
func New(conn grpc.ClientConnInterface, clock sluice.Clock, name, domain string, bucket map[string]string) (*Envoy, error) {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		return nil, err
	}
	e := &Envoy{Name: name, clock: clock, domain: domain, id: &rlqsv3.BucketId{Bucket: bucket}, stream: stream, cancel: cancel}
	go e.receive()
	return e, nil
}

func (e *Envoy) receive() {
	for {
		resp, err := e.stream.Recv()
		if err != nil {
			e.mu.Lock()
			e.err = err
			e.mu.Unlock()
			return
		}
		now := e.clock.Now()
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

func (e *Envoy) assign(s *typev3.RateLimitStrategy, ttl time.Duration, now int64) {
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
		e.fills = append(e.fills, Fill{now, e.maxTok})
	}
}

// Request is one request through the filter at the clock's time.
func (e *Envoy) Request() bool {
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := false
	switch {
	case e.strategy == nil || now >= e.expires:
	case e.strategy.GetTokenBucket() != nil:
		e.tokens = min(e.maxTok, e.tokens+e.rate*time.Duration(now-e.last).Seconds())
		e.last = now
		if e.tokens >= 1 {
			e.tokens--
			ok = true
		}
	default:
		ok = e.strategy.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
	}
	if ok {
		e.allowed++
		e.admitted = append(e.admitted, now)
	} else {
		e.denied++
	}
	return ok
}

// Report sends the usage since the last report; false once the stream has
// ended.
func (e *Envoy) Report() bool {
	now := e.clock.Now()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return false
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
		return false
	}
	e.sent.Add(1)
	return true
}

// Leave ends the stream; the filter keeps enforcing what it was assigned
// until the assignment's TTL ends.
func (e *Envoy) Leave() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
}

// Closed reports whether Leave was called.
func (e *Envoy) Closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Sent and Received count reports sent and responses applied.
func (e *Envoy) Sent() int64     { return e.sent.Load() }
func (e *Envoy) Received() int64 { return e.received.Load() }

// Err is the stream's end, if it has ended.
func (e *Envoy) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// Admitted returns the times of the requests the filter let through.
func (e *Envoy) Admitted() []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int64(nil), e.admitted...)
}

// Fills returns each time the filter's bucket was handed out full.
func (e *Envoy) Fills() []Fill {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Fill(nil), e.fills...)
}

// Strategy returns the assignment in force, nil if none.
func (e *Envoy) Strategy() *typev3.RateLimitStrategy {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.strategy
}

// Window is the most admitted in any span of width over the Envoys'
// admissions, from start to end in steps, with the bursts the Envoys held
// at the span's start or were handed in it; Over is the first span whose
// admissions pass limit plus its bursts plus extra, if any.
type Window struct {
	Most, Bursts float64
	Over         string
}

// Windows measures es over [start, end].
func Windows(es []*Envoy, start, end int64, width, step time.Duration, limit, extra float64) Window {
	var all []int64
	fills := make([][]Fill, len(es))
	for i, e := range es {
		all = append(all, e.Admitted()...)
		fills[i] = e.Fills()
	}
	var w Window
	for s := start; s+int64(width) <= end; s += int64(step) {
		n := 0
		for _, at := range all {
			if at >= s && at < s+int64(width) {
				n++
			}
		}
		bursts := 0.0
		for _, fs := range fills {
			held := 0.0
			for _, f := range fs {
				switch {
				case f.At <= s:
					held = f.Tokens
				case f.At < s+int64(width):
					bursts += f.Tokens
				}
			}
			bursts += held
		}
		if float64(n) > w.Most {
			w.Most, w.Bursts = float64(n), bursts
		}
		if float64(n) > limit+bursts+extra && w.Over == "" {
			w.Over = fmt.Sprintf("%v: %d admitted, bursts %.0f", time.Duration(s-start), n, bursts)
		}
	}
	return w
}

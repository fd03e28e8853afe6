package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Method is the full gRPC path of the quota stream.
const Method = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"

// The defaults of Options.
const (
	DefaultGrace               = 250 * time.Millisecond
	DefaultMaxBucketsPerStream = 10_000
	DefaultMaxSubscriptions    = 100_000
	DefaultMaxBucketBytes      = 64 << 20
	DefaultMaxStreams          = 10_000
)

// Options configure the quota service.
type Options struct {
	// Engine holds the rules: a bucket's fields are matched as one
	// descriptor of the stream's domain.
	Engine *engine.Engine
	// Clock times grants; nil is the system clock. It must be the clock of
	// Engine's store when the store is in this process.
	Clock sluice.Clock
	// Grace is the longest an assignment may take to reach Envoy once
	// sent: a replaced grant is counted as filling for this long, and a
	// grant as paid this long past its TTL (default 250 ms).
	Grace time.Duration
	// MaxBucketsPerStream bounds the buckets one stream reports (default
	// 10,000): a stream that goes past it is ended with RESOURCE_EXHAUSTED.
	// MaxSubscriptions bounds the buckets all streams report together
	// (default 100,000): past it, a new bucket is abandoned (answered
	// AbandonAction), and the stream and its other buckets go on.
	MaxBucketsPerStream, MaxSubscriptions int
	// MaxBucketBytes bounds the memory the distinct buckets hold (their
	// ids, three times over: as sent, as a name, as a descriptor; default
	// 64 MiB): past it, a new bucket is abandoned as past MaxSubscriptions.
	MaxBucketBytes int64
	// MaxStreams bounds the streams served at once (default 10,000): a
	// stream past it is ended at once with RESOURCE_EXHAUSTED.
	MaxStreams int
	// Fleet, if set, is the store the processes serving the same Envoys
	// share (Redis): each process records there what its streams claim of
	// a bucket and divides the bucket's limit among all processes by their
	// claims before it divides its part among its own streams. Without it
	// a process divides the whole limit among its streams.
	Fleet  Fleet
	Logger *slog.Logger
}

// Fleet keeps the processes' claims on buckets, such as the Redis store
// (store/redis Store.Claims): Claims records process id's claim on bucket
// for ttl and returns the other processes' live claims.
type Fleet interface {
	Claims(ctx context.Context, bucket, id string, claim float64, ttl time.Duration) ([]float64, error)
}

// Service is Envoy's Rate Limit Quota Service over an engine's rules.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	o  Options
	id string // this process, among the Fleet's

	mu      sync.Mutex // guards buckets, and a bucket's members as they join and leave
	buckets map[string]*bucket
	// lingering are buckets no stream reports whose departed grants still
	// fill, oldest first: kept until those end (forgetLingering).
	lingering []*bucket

	subscriptions, streams, pending, bucketBytes         atomic.Int64
	reports, responses, refused, unpaid, lost, abandoned atomic.Uint64
}

// New returns the service for o.Engine.
func New(o Options) (*Service, error) {
	if o.Engine == nil {
		return nil, errors.New("rlqs: Options.Engine is required")
	}
	if o.Clock == nil {
		o.Clock = sluice.NewSystemClock()
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.MaxBucketsPerStream <= 0 {
		o.MaxBucketsPerStream = DefaultMaxBucketsPerStream
	}
	if o.MaxSubscriptions <= 0 {
		o.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if o.MaxBucketBytes <= 0 {
		o.MaxBucketBytes = DefaultMaxBucketBytes
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	var id [8]byte
	rand.Read(id[:])
	return &Service{o: o, id: hex.EncodeToString(id[:]), buckets: map[string]*bucket{}}, nil
}

// Register serves the service on a grpc-go server.
func (s *Service) Register(g grpc.ServiceRegistrar) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, s)
}

// Stats are the service's counts.
type Stats struct {
	// Streams open, and the (stream, bucket) pairs they report.
	Streams, Subscriptions int64
	// Buckets is the distinct buckets reported.
	Buckets int
	// Pending is the assignments waiting to be sent, at most one per
	// subscription (the latest), and those of the response being sent.
	Pending int64
	// Reports is the report messages taken, each counted once its buckets
	// are divided and their assignments left to be sent. Responses is
	// those sent; Refused the streams ended for a bad report or a bound;
	// Unpaid the grants the store could not pay for in full (made smaller,
	// or DENY_ALL); Lost the store calls that failed (the grants then
	// lapse); Abandoned the buckets refused for the server's bound
	// (MaxSubscriptions).
	Reports, Responses, Refused, Unpaid, Lost, Abandoned uint64
}

// Stats returns the service's counts.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	n := len(s.buckets)
	s.mu.Unlock()
	return Stats{
		Streams: s.streams.Load(), Subscriptions: s.subscriptions.Load(), Buckets: n, Pending: s.pending.Load(),
		Reports: s.reports.Load(), Responses: s.responses.Load(), Refused: s.refused.Load(), Unpaid: s.unpaid.Load(), Lost: s.lost.Load(), Abandoned: s.abandoned.Load(),
	}
}

// StreamRateLimitQuotas serves one Envoy's stream on grpc-go.
func (s *Service) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	return s.Serve(st.Context(), st.Recv, st.Send)
}

// Serve serves one stream, whatever carries it: recv returns the client's
// reports in order (io.EOF when it has no more), send writes a response.
// Reports are answered as they arrive; a bucket's assignments can change
// when another Envoy reports it, and are then pushed. send is called from
// one goroutine of Serve's own, which may outlive Serve while a send
// blocks: Serve waits a second for it, after which the stream's end must
// unblock it.
func (s *Service) Serve(ctx context.Context, recv func() (*rlqsv3.RateLimitQuotaUsageReports, error), send func(*rlqsv3.RateLimitQuotaResponse) error) error {
	if s.streams.Add(1) > int64(s.o.MaxStreams) {
		s.streams.Add(-1)
		s.refused.Add(1)
		return refuse(codes.ResourceExhausted, "the server serves %d quota streams, its bound: try another replica", s.o.MaxStreams)
	}
	defer s.streams.Add(-1)
	ctx, cancel := context.WithCancelCause(ctx)
	c := newClient(s)
	defer c.leave()
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		c.sendLoop(ctx, cancel, send)
	}()
	// Once the stream ends, what waits in the mailbox is sent (a client
	// that half-closes still reads its answers), for a second at most: a
	// send blocked by a client that does not read cannot hold Serve.
	defer func() {
		c.drain()
		select {
		case <-sending:
		case <-time.After(time.Second):
		}
		cancel(nil)
	}()
	for {
		m, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := c.report(ctx, m); err != nil {
			s.refused.Add(1)
			return err
		}
		if err := context.Cause(ctx); err != nil {
			if _, ok := status.FromError(err); ok {
				return err // a send that failed, with its own status
			}
			return status.FromContextError(err).Err()
		}
	}
}

// refuse is a bad report's answer.
func refuse(c codes.Code, format string, args ...any) error {
	return status.Errorf(c, format, args...)
}

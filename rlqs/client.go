package rlqs

import (
	"context"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// client is one stream: the Envoy at its other end, its domain and the
// buckets it reports. Answers wait in a mailbox that keeps the latest action
// per bucket, so a client that does not read holds at most one action per
// bucket, and nobody who changes its assignments ever waits for it.
type client struct {
	s       *Service
	domain  string
	members map[string]*member // by canonical bucket name; the reader's
	// abandoned are the buckets answered AbandonAction, each one mailbox
	// entry; the reader's.
	abandoned map[string]*member

	mu      sync.Mutex // guards pending and ending
	pending map[*member]*rlqsv3.RateLimitQuotaResponse_BucketAction
	ending  bool // the stream has ended: the sender stops once pending is sent
	wake    chan struct{}
}

func newClient(s *Service) *client {
	return &client{s: s, members: map[string]*member{}, abandoned: map[string]*member{}, pending: map[*member]*rlqsv3.RateLimitQuotaResponse_BucketAction{}, wake: make(chan struct{}, 1)}
}

// report takes one message of usage reports: the buckets it names are
// subscribed (the first report of a bucket), their usage noted, and each
// bucket divided again.
func (c *client) report(ctx context.Context, m *rlqsv3.RateLimitQuotaUsageReports) error {
	s := c.s
	defer s.reports.Add(1)
	switch {
	case c.domain == "" && m.GetDomain() == "":
		return refuse(codes.InvalidArgument, "the stream's first report must name the domain")
	case c.domain == "":
		if !s.o.Engine.ServesDomain(m.Domain) {
			return refuse(codes.InvalidArgument, "unknown domain %q: no rule has descriptors in it", m.Domain)
		}
		c.domain = m.Domain
	case m.GetDomain() != "" && m.Domain != c.domain:
		return refuse(codes.InvalidArgument, "domain %q after %q: a stream keeps the domain of its first report", m.Domain, c.domain)
	}
	if n := len(m.GetBucketQuotaUsages()); n > s.o.MaxBucketsPerStream {
		return refuse(codes.ResourceExhausted, "%d bucket reports in one message, at most %d are taken", n, s.o.MaxBucketsPerStream)
	}
	now := s.o.Clock.Now()
	touched := make([]*member, 0, len(m.GetBucketQuotaUsages()))
	for i, u := range m.GetBucketQuotaUsages() {
		name, entries, err := canonical(c.domain, u.GetBucketId())
		if err != nil {
			return refuse(codes.InvalidArgument, "bucket_quota_usages[%d]: %v", i, err)
		}
		elapsed := time.Duration(0)
		if te := u.GetTimeElapsed(); te != nil {
			if err := te.CheckValid(); err != nil || te.AsDuration() < 0 {
				return refuse(codes.InvalidArgument, "bucket_quota_usages[%d].time_elapsed: want a duration of 0 or more", i)
			}
			elapsed = te.AsDuration()
		}
		mb := c.members[name]
		if mb == nil {
			if len(c.members) >= s.o.MaxBucketsPerStream {
				return refuse(codes.ResourceExhausted, "this stream reports %d buckets, at most %d are taken on one stream", len(c.members), s.o.MaxBucketsPerStream)
			}
			if s.subscriptions.Add(1) <= int64(s.o.MaxSubscriptions) {
				mb = s.subscribe(c, name, entries, u.GetBucketId())
			}
			if mb == nil {
				// The server is full, not the stream at fault: this
				// bucket is abandoned (Envoy falls back to its
				// no-assignment behaviour for it), the others go on.
				s.subscriptions.Add(-1)
				if err := c.abandon(name, u.GetBucketId()); err != nil {
					return err
				}
				continue
			}
			c.members[name] = mb
		}
		mb.b.observe(mb, u.GetNumRequestsAllowed()+u.GetNumRequestsDenied(), elapsed, now)
		touched = append(touched, mb)
	}
	for _, mb := range touched {
		mb.b.rebalance(ctx, now, mb)
	}
	return nil
}

// maxAbandons bounds the abandoned buckets a stream holds (each its id,
// for the answer): a stream that goes on reporting new buckets to a full
// server past it is ended.
const maxAbandons = 16

// abandon answers a bucket the server has no room for with AbandonAction.
func (c *client) abandon(name string, id *rlqsv3.BucketId) error {
	c.s.abandoned.Add(1)
	ghost := c.abandoned[name]
	if ghost == nil {
		if len(c.abandoned) >= maxAbandons {
			return refuse(codes.ResourceExhausted, "the server holds as many buckets as it takes, and this stream reported %d more: try another replica", len(c.abandoned))
		}
		ghost = &member{c: c, id: proto.Clone(id).(*rlqsv3.BucketId)}
		c.abandoned[name] = ghost
	}
	c.push(ghost, &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     ghost.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	})
	return nil
}

// push leaves an action for the sender, replacing any not yet sent for the
// same bucket.
func (c *client) push(mb *member, a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	c.mu.Lock()
	if _, ok := c.pending[mb]; !ok {
		c.s.pending.Add(1)
	}
	c.pending[mb] = a
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// maxActions bounds the actions of one response, so that a response stays
// small whatever the mailbox holds.
const maxActions = 256

// sendLoop sends what the mailbox holds, at most maxActions a response,
// until ctx ends, a send fails (which ends the stream), or the stream has
// ended (drain) and the mailbox is empty.
func (c *client) sendLoop(ctx context.Context, cancel context.CancelCauseFunc, send func(*rlqsv3.RateLimitQuotaResponse) error) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		for {
			c.mu.Lock()
			resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, min(len(c.pending), maxActions))}
			for mb, a := range c.pending {
				if len(resp.BucketAction) == maxActions {
					break
				}
				resp.BucketAction = append(resp.BucketAction, a)
				delete(c.pending, mb)
			}
			ending := c.ending
			c.mu.Unlock()
			if len(resp.BucketAction) == 0 {
				if ending {
					return
				}
				break
			}
			err := send(resp)
			if err == nil {
				c.s.responses.Add(1)
			}
			c.s.pending.Add(-int64(len(resp.BucketAction)))
			if err != nil {
				cancel(err)
				return
			}
		}
	}
}

// drain tells the sender the stream has ended: it sends what the mailbox
// holds and stops.
func (c *client) drain() {
	c.mu.Lock()
	c.ending = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// leave unsubscribes the stream's buckets. What their grants were paid for
// stays spent: the Envoy may use its assignments until their TTLs end.
func (c *client) leave() {
	for _, mb := range c.members {
		c.s.unsubscribe(mb)
	}
	c.s.subscriptions.Add(-int64(len(c.members)))
	clear(c.members)
	c.mu.Lock() // no bucket can push to it now
	c.s.pending.Add(-int64(len(c.pending)))
	clear(c.pending)
	c.mu.Unlock()
}

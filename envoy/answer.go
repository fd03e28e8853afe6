package envoy

import (
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// answerArena holds the messages of one ShouldRateLimit answer for reuse by
// the next call on the same scratch. Built fresh, an answer of one
// descriptor is seven allocations (the response, its status, the limit, the
// duration, the header values and two slices of pointers), about a fifth of
// the bytes a call on the embedded store allocated; reused, none once the
// arena has grown to the calls it sees.
//
// A nil *answerArena hands out fresh messages: the answer then outlives the
// call, as grpc-go needs (it encodes after the method returns).
type answerArena struct {
	resp      rlsv3.RateLimitResponse
	statuses  reused[rlsv3.RateLimitResponse_DescriptorStatus]
	limits    reused[rlsv3.RateLimitResponse_RateLimit]
	durations reused[durationpb.Duration]
	values    []corev3.HeaderValue
}

// response starts an answer: every message handed out for the previous one
// is taken back.
func (a *answerArena) response() *rlsv3.RateLimitResponse {
	if a == nil {
		return new(rlsv3.RateLimitResponse)
	}
	statuses, headers := a.resp.Statuses[:0], a.resp.ResponseHeadersToAdd[:0]
	clear(statuses[:cap(statuses)])
	clear(headers[:cap(headers)])
	a.resp = rlsv3.RateLimitResponse{Statuses: statuses, ResponseHeadersToAdd: headers}
	a.statuses.n, a.limits.n, a.durations.n = 0, 0, 0
	return &a.resp
}

func (a *answerArena) status() *rlsv3.RateLimitResponse_DescriptorStatus {
	if a == nil {
		return new(rlsv3.RateLimitResponse_DescriptorStatus)
	}
	return a.statuses.next()
}

func (a *answerArena) limit() *rlsv3.RateLimitResponse_RateLimit {
	if a == nil {
		return new(rlsv3.RateLimitResponse_RateLimit)
	}
	return a.limits.next()
}

// reused hands out the messages of one kind an answer needs, made once and
// zeroed for each answer.
type reused[T any] struct {
	items []*T
	n     int // handed out in this answer
}

func (r *reused[T]) next() *T {
	if r.n == len(r.items) {
		r.items = append(r.items, new(T))
	}
	p := r.items[r.n]
	r.n++
	var zero T
	*p = zero
	return p
}

// duration is durationpb.New(d).
func (a *answerArena) duration(d time.Duration) *durationpb.Duration {
	if a == nil {
		return durationpb.New(d)
	}
	p := a.durations.next()
	p.Seconds, p.Nanos = int64(d/time.Second), int32(d%time.Second)
	return p
}

// headerValues returns room for n header values, empty. The caller must not
// append beyond n: the answer points into it.
func (a *answerArena) headerValues(n int) []corev3.HeaderValue {
	if a == nil {
		return make([]corev3.HeaderValue, 0, n)
	}
	if cap(a.values) < n {
		a.values = make([]corev3.HeaderValue, 0, n)
	}
	clear(a.values[:cap(a.values)])
	return a.values[:0]
}

package grpclimit

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/client"
)

// Client is the calling side: UnaryClientInterceptor retries and paces
// calls as client.Transport does HTTP requests, by running each call
// through one. A call is to the Transport a request to the connection's
// target: its answer read in HTTP terms (OK 200; ResourceExhausted 429 and
// Unavailable with RetryInfo 503, with RetryInfo as Retry-After: the
// server refused before running the call, which any call may retry; an
// Unavailable without it, a lost connection, 502, which only an idempotent
// call retries), its RateLimit metadata as the fields the Transport paces
// by. So the waits, the retry budget, the deadline (the call's context)
// and the pacing are the HTTP client's, one implementation.
type Client struct {
	// Transport holds the retry and pacing settings (MaxRetries,
	// MaxElapsed, MaxDelay, BudgetTokens, RetryRatio, NoPacing, OnRetry,
	// OnPace); its Base is set by the Client.
	Transport client.Transport
	// Idempotent reports whether a method may run twice, so that a call
	// that may have reached the service is retried. Default: none.
	Idempotent func(fullMethod string) bool

	once sync.Once
}

type callKey struct{}

// attempt is one call as the Transport's requests see it.
type attempt struct {
	invoke func(ctx context.Context) (metadata.MD, error)
	err    error
}

func (c *Client) init() {
	c.once.Do(func() { c.Transport.Base = roundTripper{} })
}

// UnaryClientInterceptor retries refused calls as their server asks and
// paces calls by the RateLimit metadata.
func (c *Client) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	c.init()
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		a := &attempt{invoke: func(ctx context.Context) (metadata.MD, error) {
			var header, trailer metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(opts[:len(opts):len(opts)], grpc.Header(&header), grpc.Trailer(&trailer))...)
			return metadata.Join(header, trailer), err
		}}
		verb := http.MethodPost
		if c.Idempotent != nil && c.Idempotent(method) {
			verb = http.MethodPut
		}
		hr := (&http.Request{Method: verb, URL: &url.URL{Scheme: "grpc", Host: cc.Target(), Path: method}, Header: http.Header{}}).
			WithContext(context.WithValue(ctx, callKey{}, a))
		resp, err := c.Transport.RoundTrip(hr)
		if resp != nil {
			resp.Body.Close()
		}
		return callError(err, a)
	}
}

// StreamClientInterceptor paces the opening of streams by what calls to
// the same target learnt. A server-streaming call (one request, then the
// server's messages) refused before its first message is opened again
// after the wait the refusal asks, within the same limits as a unary
// call's retries; other streams are not retried, their messages being the
// caller's to send again.
func (c *Client) StreamClientInterceptor() grpc.StreamClientInterceptor {
	c.init()
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		open := func(ctx context.Context) (grpc.ClientStream, error) {
			var cs grpc.ClientStream
			a := &attempt{invoke: func(ctx context.Context) (metadata.MD, error) {
				var err error
				cs, err = streamer(ctx, desc, cc, method, opts...)
				return nil, err
			}}
			hr := (&http.Request{Method: http.MethodPost, URL: &url.URL{Scheme: "grpc", Host: cc.Target(), Path: method}, Header: http.Header{}}).
				WithContext(context.WithValue(ctx, callKey{}, a))
			resp, err := c.Transport.RoundTrip(withNoRetry(hr)) // paced; the opening goes once
			if resp != nil {
				resp.Body.Close()
			}
			return cs, callError(err, a)
		}
		cs, err := open(ctx)
		if err != nil || desc.ClientStreams || !desc.ServerStreams {
			return cs, err
		}
		return &serverStream{ClientStream: cs, c: c, ctx: ctx, open: open}, nil
	}
}

// serverStream opens a server-streaming call again when the server refused
// it before its first message: the request is kept to be sent again.
type serverStream struct {
	grpc.ClientStream
	c        *Client
	ctx      context.Context
	open     func(context.Context) (grpc.ClientStream, error)
	req      any
	received bool
	retries  int
}

func (s *serverStream) SendMsg(m any) error {
	s.req = m
	return s.ClientStream.SendMsg(m)
}

func (s *serverStream) RecvMsg(m any) error {
	for {
		err := s.ClientStream.RecvMsg(m)
		if err == nil {
			s.received = true
			return nil
		}
		wait, ok := s.retryWait(err)
		if !ok {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		cs, oerr := s.open(s.ctx)
		if oerr != nil {
			return oerr
		}
		if err := cs.SendMsg(s.req); err != nil {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
		s.ClientStream = cs
		s.retries++
	}
}

// retryWait is the wait before opening the stream again, if it may be:
// refused (ResourceExhausted, or Unavailable with RetryInfo) before any
// message, its request known, within MaxRetries and MaxDelay and the
// deadline.
func (s *serverStream) retryWait(err error) (time.Duration, bool) {
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	maxRetries, maxDelay := s.c.Transport.RetryLimits()
	switch {
	case s.received || s.req == nil || retry == nil || s.retries >= maxRetries:
		return 0, false
	case st.Code() != codes.ResourceExhausted && st.Code() != codes.Unavailable:
		return 0, false
	}
	wait := retry.RetryDelay.AsDuration()
	if d, ok := s.ctx.Deadline(); wait > maxDelay || ok && time.Now().Add(wait).After(d) {
		return 0, false
	}
	return wait, true
}

// callError is the call's answer: the last attempt's, or why none was
// made or waited out (the pace past the deadline: ResourceExhausted, as
// the server would have answered; the context's end).
func callError(err error, a *attempt) error {
	switch {
	case err == nil || a.err != nil:
		return a.err
	case errors.Is(err, client.ErrBeyondDeadline):
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return status.FromContextError(err).Err()
}

// withNoRetry marks a request whose answer must not be retried: its body
// cannot be sent again (a stream's opening).
func withNoRetry(r *http.Request) *http.Request {
	r.Body = noRewind{}
	return r
}

type noRewind struct{}

func (noRewind) Read([]byte) (int, error) { return 0, nil }
func (noRewind) Close() error             { return nil }

// roundTripper makes the call a request stands for and answers in HTTP
// terms.
type roundTripper struct{}

func (roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	a := r.Context().Value(callKey{}).(*attempt)
	md, err := a.invoke(r.Context())
	a.err = err
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}
	for _, k := range []string{"ratelimit", "ratelimit-policy"} {
		if v := md.Get(k); len(v) > 0 {
			resp.Header.Set(k, v[0])
		}
	}
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	switch {
	case err == nil:
	case st.Code() == codes.ResourceExhausted:
		resp.StatusCode = http.StatusTooManyRequests
	case st.Code() == codes.Unavailable && retry != nil:
		resp.StatusCode = http.StatusServiceUnavailable
	case st.Code() == codes.Unavailable:
		resp.StatusCode = http.StatusBadGateway
	default:
		resp.StatusCode = httpStatus(st.Code())
		if resp.StatusCode >= 500 {
			resp.StatusCode = http.StatusInternalServerError // not retried
		}
	}
	if retry != nil {
		wait := retry.RetryDelay.AsDuration()
		if d, ok := r.Context().Deadline(); ok && time.Now().Add(wait).After(d) {
			wait = 365 * 24 * time.Hour // past the call's deadline: answered now, not waited for
		}
		resp.Header.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10))
	}
	return resp, nil
}

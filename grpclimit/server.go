package grpclimit

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
)

// Options configure the server interceptors.
type Options struct {
	// HTTP shapes the answers and the pipeline as for the HTTP middleware:
	// trusted proxies (default: the rule file's), MaxDelay, the
	// concurrency limit and the pressure adaptive rules follow.
	HTTP httplimit.Options
	// Attributes, if set, gives key sources values the service knows of a
	// call, by source name, as the JSON API's attributes do: an
	// authenticated identity an earlier interceptor put in the context,
	// as attrs["user"], is then the value of every rule's user source.
	Attributes func(ctx context.Context, fullMethod string, attrs map[string]string)
	// OnDecision, if set, is told each decision with the method it was
	// for (a stream's messages too): for metrics by method, which the
	// engine's, by rule, do not give. res is valid only during the call.
	OnDecision func(fullMethod string, res *engine.Result)
}

// Limiter decides gRPC calls by the rules of an engine.
type Limiter struct {
	e *engine.Engine
	l *httplimit.Limiter
	o Options
}

// New returns a Limiter over e.
func New(e *engine.Engine, o Options) *Limiter {
	if o.HTTP.TraceVia == "" {
		o.HTTP.TraceVia = "grpc"
	}
	o.HTTP.LogVia, o.HTTP.LogPath = "grpc", true // the method
	return &Limiter{e: e, l: httplimit.New(e, o.HTTP), o: o}
}

// UnaryServerInterceptor decides each unary call before its handler runs.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		x := getCall(l, ctx)
		defer putCall(x)
		x.forward = func(ctx context.Context) error {
			var err error
			x.resp, err = handler(ctx, req)
			return err
		}
		r := l.request(ctx, info.FullMethod, "POST")
		l.body(r, req)
		err := x.serve(info.FullMethod, r)
		return x.resp, err
	}
}

// StreamServerInterceptor decides each stream when it opens, and each
// message the server receives on it as a request of method MESSAGE.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		x := getCall(l, ss.Context())
		defer putCall(x)
		x.forward = func(context.Context) error {
			return handler(srv, &stream{ServerStream: ss, l: l, method: info.FullMethod})
		}
		return x.serve(info.FullMethod, l.request(ss.Context(), info.FullMethod, "POST"))
	}
}

// stream decides each message the server receives.
type stream struct {
	grpc.ServerStream
	l      *Limiter
	method string
}

// RecvMsg receives a message and runs it through the pipeline as a call
// of method MESSAGE (see call.message): refused, held for a leaky queue's
// delay within MaxDelay, and traced and logged as a call is; within its
// stream's concurrency permit.
func (s *stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	x := getCall(s.l, ctx)
	defer putCall(x)
	x.message = true
	req := s.l.request(ctx, s.method, "MESSAGE")
	s.l.body(req, m)
	return x.serve(s.method, req)
}

// request is the call as the rules read it.
func (l *Limiter) request(ctx context.Context, fullMethod, method string) *rules.Request {
	md, _ := metadata.FromIncomingContext(ctx)
	header := make(http.Header, len(md))
	host := ""
	for k, vs := range md {
		switch {
		case k == ":authority":
			if len(vs) > 0 {
				host = vs[0]
			}
		case strings.HasPrefix(k, ":"), strings.HasSuffix(k, "-bin"):
		default:
			header[canonical(k)] = vs
		}
	}
	cfg := l.e.Config()
	var addr netip.Addr
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = peerAddr(p.Addr)
	}
	req := &rules.Request{Method: method, Host: host, Path: fullMethod, Header: header,
		ClientIP: l.o.HTTP.Trust(cfg).Client(addr, header)}
	if l.o.Attributes != nil {
		req.Attributes = map[string]string{}
		l.o.Attributes(ctx, fullMethod, req.Attributes)
	}
	return req
}

// body gives the rules the request message as the JSON body body sources
// and reserve rules' estimateBody read (protobuf's JSON, fields by their
// .proto names), when a rule reads a body: a key or a cost from a field
// of the message, as from an HTTP request's JSON.
func (l *Limiter) body(req *rules.Request, msg any) {
	if !l.e.Config().NeedsBody() {
		return
	}
	m, ok := msg.(proto.Message)
	if !ok {
		req.BodyUnseen = true // a body source is missing, not read from something else
		return
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		req.BodyUnseen = true
		return
	}
	if len(b) > rules.MaxBodyBytes {
		b, req.BodyTruncated = b[:rules.MaxBodyBytes], true
	}
	req.Body = b
	req.Header.Set("Content-Type", "application/json")
}

func peerAddr(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	return httplimit.ParseAddr(a.String())
}

// call is one gRPC call as the pipeline's Exchange, with its result:
// pooled, so that a call reuses the buffers of the ones before it.
type call struct {
	l   *Limiter
	ctx context.Context
	// message: the call is a message a stream received. Forwarding it is
	// handing it to the handler, and nothing follows from its answer:
	// countOn rules are checked, never charged, reserve rules take their
	// estimate (SeesResponse), and no metadata is sent (the stream's went
	// when it opened).
	message bool
	forward func(context.Context) error
	resp    any
	err     error
	header  metadata.MD
	res     engine.Result
}

var calls = sync.Pool{New: func() any { return new(call) }}

func getCall(l *Limiter, ctx context.Context) *call {
	x := calls.Get().(*call)
	x.l, x.ctx = l, ctx
	return x
}

func putCall(x *call) {
	x.l, x.ctx, x.forward, x.resp, x.err, x.header, x.message = nil, nil, nil, nil, nil, nil, false
	calls.Put(x)
}

// serve runs the pipeline and returns the call's error: the handler's, or
// the refusal's.
func (x *call) serve(method string, req *rules.Request) error {
	x.l.l.Serve(x, req, &x.res)
	if x.l.o.OnDecision != nil {
		x.l.o.OnDecision(method, &x.res)
	}
	if len(x.header) > 0 && !x.message {
		grpc.SetHeader(x.ctx, x.header)
	}
	return x.err
}

func (x *call) Context() context.Context { return x.ctx }

func (x *call) Hold(d time.Duration) bool { return httplimit.Hold(x.ctx, d) }

func (x *call) Abandon() { x.err = status.FromContextError(x.ctx.Err()).Err() }

func (x *call) Refuse(res *engine.Result) {
	x.fields(res)
	x.err = refusal(res)
}

func (x *call) Shed() {
	x.header = metadata.Pairs("retry-after", "1")
	x.err = withRetry(status.New(codes.Unavailable, "the service is at its concurrency limit"), time.Second, nil).Err()
}

func (x *call) Forward(_ string, res *engine.Result, _, _ bool) int {
	if x.message {
		return http.StatusOK // the message goes on to the handler
	}
	x.fields(res)
	if len(x.header) > 0 { // before the handler, which may send its headers (a stream)
		grpc.SetHeader(x.ctx, x.header)
		x.header = nil
	}
	x.err = x.forward(x.ctx)
	return httpStatus(status.Code(x.err))
}

func (x *call) ResponseHeader(string) string { return "" }
func (x *call) ResponseBody() []byte         { return nil }
func (x *call) SeesResponse() bool           { return !x.message }

// HoldsPermit: a message is handed on within its stream's concurrency
// permit (httplimit.PermitHolder).
func (x *call) HoldsPermit() bool { return x.message }

func (x *call) TraceContext() (string, httplimit.HeaderCarrier) {
	md, _ := metadata.FromIncomingContext(x.ctx)
	return "grpc", carrier(md)
}

// fields keeps the RateLimit fields of res for the response's metadata.
func (x *call) fields(res *engine.Result) {
	x.l.l.VisitHeaders(res, func(name string, value []byte) {
		if x.header == nil {
			x.header = metadata.MD{}
		}
		k := metadataName(name)
		x.header[k] = append(x.header[k], string(value))
	})
}

// metadataName is a field's name in metadata: lower case (the fields
// sluice sends, without allocating).
func metadataName(name string) string {
	switch name {
	case "RateLimit":
		return "ratelimit"
	case "RateLimit-Policy":
		return "ratelimit-policy"
	case "Retry-After":
		return "retry-after"
	}
	return strings.ToLower(name)
}

// canonicalNames caches header names in canonical form for metadata keys
// (lower case on the wire), bounded: past it, names are made per call.
var canonicalNames sync.Map

const maxCanonicalNames = 256

var canonicalCount atomic.Int32

func canonical(k string) string {
	if v, ok := canonicalNames.Load(k); ok {
		return v.(string)
	}
	c := http.CanonicalHeaderKey(k)
	if canonicalCount.Load() < maxCanonicalNames {
		if _, loaded := canonicalNames.LoadOrStore(k, c); !loaded {
			canonicalCount.Add(1)
		}
	}
	return c
}

// carrier reads and writes metadata as trace context fields.
type carrier metadata.MD

func (c carrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (c carrier) Set(k, v string) { metadata.MD(c).Set(k, v) }
func (c carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

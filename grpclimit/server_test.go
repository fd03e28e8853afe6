package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/grpclimit"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// serve starts a grpc-go server with the health and reflection services
// behind the interceptors, on rules src, and returns a client connection.
func serve(t *testing.T, src string, o grpclimit.Options) *grpc.ClientConn {
	t.Helper()
	e := engineOf(t, src)
	l := grpclimit.New(e, o)
	s := grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServerInterceptor()), grpc.StreamInterceptor(l.StreamServerInterceptor()))
	reflection.Register(s)
	conn := served(t, s)
	return conn
}

func check(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, opts...)
	return err
}

func withUser(u string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-user-id", u)
}

// Calls are limited per key from metadata; the refusal is
// ResourceExhausted with RetryInfo and QuotaFailure that a plain grpc-go
// client decodes, and the RateLimit fields come as metadata.
func TestUnaryCallsAreLimitedByMethodAndMetadata(t *testing.T) {
	conn := serve(t, `
rules:
  - {id: per-user, match: {path: "/grpc.health.v1.Health/*"}, key: [user], rate: 3, per: 1h}
  - {id: other-service, match: {path: "/other.Service/*"}, key: [user], rate: 1, per: 1h}
`, grpclimit.Options{})
	for i := range 3 {
		var header metadata.MD
		if err := check(withUser("u1"), conn, grpc.Header(&header)); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if i == 2 && len(header.Get("ratelimit")) == 0 {
			t.Errorf("an admitted call near its limit has no ratelimit metadata: %v", header)
		}
	}
	var header, trailer metadata.MD
	err := check(withUser("u1"), conn, grpc.Header(&header), grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("the 4th call: %v, want ResourceExhausted", err)
	}
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() < 19*time.Minute || retry.RetryDelay.AsDuration() > 20*time.Minute {
		t.Fatalf("RetryInfo %v, want about 20 minutes", retry)
	}
	if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "rule:per-user" {
		t.Fatalf("QuotaFailure %v, want the rule per-user", quota)
	}
	md := metadata.Join(header, trailer)
	if len(md.Get("ratelimit")) == 0 || len(md.Get("ratelimit-policy")) == 0 || len(md.Get("retry-after")) == 0 {
		t.Fatalf("a refusal's metadata: %v, want ratelimit, ratelimit-policy, retry-after", md)
	}
	if err := check(withUser("u2"), conn); err != nil {
		t.Fatalf("another user: %v", err)
	}
}

// The peer is the client unless it is a trusted proxy; then the
// forwarding fields name the client, as on HTTP.
func TestThePeerIsTheClientBehindTrustedProxiesOnly(t *testing.T) {
	src := "%s\nrules:\n  - {id: per-ip, key: [ip], rate: 2, per: 1h}\n"
	spoof := func(ip string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", ip)
	}
	untrusted := serve(t, sprintf(src, ""), grpclimit.Options{})
	ok := 0
	for _, ip := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"} {
		if check(spoof(ip), untrusted) == nil {
			ok++
		}
	}
	if ok != 2 {
		t.Fatalf("spoofed X-Forwarded-For from an untrusted peer: %d of 4 admitted, want 2 (one client)", ok)
	}
	trusted := serve(t, sprintf(src, "trustedProxies: [127.0.0.0/8]"), grpclimit.Options{})
	ok = 0
	for _, ip := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"} {
		if check(spoof(ip), trusted) == nil {
			ok++
		}
	}
	if ok != 4 {
		t.Fatalf("four clients behind a trusted proxy: %d of 4 admitted", ok)
	}
}

type identityKey struct{}

// A value the service put in the context keys the rules.
func TestAnIdentityFromTheContextKeysTheRules(t *testing.T) {
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if who := md.Get("authorization"); len(who) > 0 {
			ctx = context.WithValue(ctx, identityKey{}, "acct-"+who[0])
		}
		return h(ctx, req)
	}
	e := engineOf(t, "keys: {account: {header: X-Account}}\nrules:\n  - {id: per-account, key: [account], rate: 1, per: 1h}\n")
	l := grpclimit.New(e, grpclimit.Options{Attributes: func(ctx context.Context, _ string, attrs map[string]string) {
		if id, ok := ctx.Value(identityKey{}).(string); ok {
			attrs["account"] = id
		}
	}})
	conn := served(t, grpc.NewServer(grpc.ChainUnaryInterceptor(auth, l.UnaryServerInterceptor())))
	as := func(who string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", who)
	}
	if err := check(as("a"), conn); err != nil {
		t.Fatal(err)
	}
	if err := check(as("a"), conn); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("account a's second call: %v", err)
	}
	if err := check(as("b"), conn); err != nil {
		t.Fatalf("account b: %v", err)
	}
}

// A stream is decided when it opens, and each message it receives by the
// rules that name MESSAGE; a rule that names no method counts the stream
// once.
func TestAStreamsMessagesAreCountedByTheRulesThatSaySo(t *testing.T) {
	conn := serve(t, `
rules:
  - {id: streams, match: {path: "/grpc.reflection.v1.ServerReflection/*"}, key: [user], rate: 2, per: 1h}
  - {id: messages, match: {method: MESSAGE, path: "/grpc.reflection.v1.ServerReflection/*"}, key: [user], rate: 3, per: 1h}
`, grpclimit.Options{})
	client := reflectionpb.NewServerReflectionClient(conn)
	open := func() (reflectionpb.ServerReflection_ServerReflectionInfoClient, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(withUser("s1"), 10*time.Second)
		st, err := client.ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st, cancel
	}
	st, cancel := open()
	defer cancel()
	answered := 0
	var last error
	for range 5 {
		if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			last = err
			break
		}
		if _, err := st.Recv(); err != nil {
			last = err
			break
		}
		answered++
	}
	if answered != 3 || status.Code(last) != codes.ResourceExhausted {
		t.Fatalf("messages on a stream: %d answered, then %v; want 3, then ResourceExhausted", answered, last)
	}
	second, cancel2 := open()
	defer cancel2()
	second.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second stream, its messages spent: %v", err)
	}
	third, cancel3 := open()
	defer cancel3()
	third.CloseSend()
	_, err := third.Recv()
	if status.Code(err) != codes.ResourceExhausted || errors.Is(err, io.EOF) {
		t.Fatalf("a third stream, two allowed: %v, want ResourceExhausted at open", err)
	}
}

// The decision log names the face and the method, and OnDecision is told
// each decision with its method (for metrics by method).
func TestTheDecisionLogNamesTheMethod(t *testing.T) {
	var buf syncBuffer
	cfg, _ := rules.Parse("t.yaml", []byte("rules:\n  - {id: r, key: [ip], rate: 1, per: 1h}\n"))
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet,
		DecisionLog: &engine.DecisionLog{Logger: slog.New(slog.NewTextHandler(&buf, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	byMethod := map[string][2]int{} // allowed, refused
	l := grpclimit.New(e, grpclimit.Options{OnDecision: func(m string, res *engine.Result) {
		mu.Lock()
		defer mu.Unlock()
		c := byMethod[m]
		if res.Allowed {
			c[0]++
		} else {
			c[1]++
		}
		byMethod[m] = c
	}})
	conn := served(t, grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServerInterceptor())))
	check(context.Background(), conn)
	check(context.Background(), conn)
	mu.Lock()
	if c := byMethod["/grpc.health.v1.Health/Check"]; c != [2]int{1, 1} {
		t.Errorf("decisions told by method: %v, want one allowed and one refused for Check", byMethod)
	}
	mu.Unlock()
	if line := buf.String(); !strings.Contains(line, "via=grpc") || !strings.Contains(line, "method=/grpc.health.v1.Health/Check") || !strings.Contains(line, "allowed=false") {
		t.Fatalf("the decision log: %q", line)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The concurrency limit of the HTTP options holds for calls: one in
// flight, the next answered Unavailable with RetryInfo, and a shadow rule
// that would refuse lets the call through.
func TestTheConcurrencyLimitAndShadowRulesHoldForCalls(t *testing.T) {
	e := engineOf(t, "rules:\n  - {id: would, key: [ip], rate: 1, per: 1h, mode: shadow}\n")
	release := make(chan struct{})
	inside := make(chan struct{}, 1)
	l := grpclimit.New(e, grpclimit.Options{HTTP: httplimit.Options{Concurrency: concurrency.New(concurrency.Fixed{N: 1}, concurrency.Options{})}})
	hold := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("hold")) > 0 {
			inside <- struct{}{}
			<-release
		}
		return h(ctx, req)
	}
	conn := served(t, grpc.NewServer(grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor(), hold)))
	done := make(chan error, 1)
	go func() { done <- check(metadata.AppendToOutgoingContext(context.Background(), "hold", "1"), conn) }()
	<-inside
	err := check(context.Background(), conn)
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || len(st.Details()) == 0 {
		t.Fatalf("a call beyond the concurrency limit: %v %v, want Unavailable with RetryInfo", err, st.Details())
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the held call: %v", err)
	}
	for range 3 {
		if err := check(context.Background(), conn); err != nil {
			t.Fatalf("a shadow rule refused: %v", err)
		}
	}
}

// A key and a cost can come from the request message's fields, as from an
// HTTP request's JSON body: here the health check's service names the
// key, and a reserve rule's estimate is a field of the message.
func TestKeysAndCostsFromTheRequestMessage(t *testing.T) {
	conn := serve(t, `
keys:
  svc: {body: service}
rules:
  - {id: per-service, key: [svc], rate: 2, per: 1h}
`, grpclimit.Options{})
	call := func(svc string) error {
		_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		return err
	}
	for range 2 {
		if err := call("orders"); status.Code(err) != codes.NotFound { // the health server knows no "orders": it ran
			t.Fatalf("within the limit: %v", err)
		}
	}
	if err := call("orders"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the third call for service orders: %v", err)
	}
	if err := call("billing"); status.Code(err) != codes.NotFound {
		t.Fatalf("another service in the message: %v", err)
	}

	e := engineOf(t, "rules:\n  - {id: seconds, key: [ip], rate: 10, per: 1h, reserve: {estimate: 1, estimateBody: tokens}}\n")
	intercept := grpclimit.New(e, grpclimit.Options{}).UnaryServerInterceptor()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 1}})
	ctx = grpc.NewContextWithServerTransportStream(ctx, discardStream{})
	info := &grpc.UnaryServerInfo{FullMethod: "/t.T/Complete"}
	ok := func(context.Context, any) (any, error) { return nil, nil }
	tokens := func(n float64) *structpb.Struct { // {"tokens": n} as the message
		m, _ := structpb.NewStruct(map[string]any{"tokens": n})
		return m
	}
	if _, err := intercept(ctx, tokens(7), info, ok); err != nil {
		t.Fatalf("a message costing 7 of 10: %v", err)
	}
	if _, err := intercept(ctx, tokens(4), info, ok); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a message costing 4 with 3 left: %v", err)
	}
	if _, err := intercept(ctx, tokens(3), info, ok); err != nil {
		t.Fatalf("a message costing the 3 left: %v", err)
	}
}

// An admitted stream carries the RateLimit metadata in its headers, set
// before the handler sends its own.
func TestAnAdmittedStreamCarriesTheRateLimitMetadata(t *testing.T) {
	conn := serve(t, "rules:\n  - {id: r, key: [ip], rate: 2, per: 1h}\n", grpclimit.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	md, err := w.Header()
	if err != nil || len(md.Get("ratelimit")) == 0 {
		t.Fatalf("an admitted stream's headers: %v %v, want ratelimit", md, err)
	}
}

// A countOn rule is charged from the call's status read as HTTP: here
// NotFound (404) is counted and OK is not.
func TestACountOnRuleIsChargedFromTheCallsStatus(t *testing.T) {
	conn := serve(t, "rules:\n  - {id: misses, key: [user], rate: 2, per: 1h, countOn: {status: [404]}}\n", grpclimit.Options{})
	call := func(svc string) error {
		_, err := healthpb.NewHealthClient(conn).Check(withUser("u"), &healthpb.HealthCheckRequest{Service: svc})
		return err
	}
	for range 5 {
		if err := call(""); err != nil {
			t.Fatalf("a call answered OK, not counted: %v", err)
		}
	}
	for range 2 {
		if err := call("unknown"); status.Code(err) != codes.NotFound {
			t.Fatalf("a counted miss: %v", err)
		}
	}
	if err := call(""); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("after two misses: %v, want ResourceExhausted", err)
	}
}

// countingTracer counts the decisions it is asked to trace, by face.
type countingTracer struct {
	mu  sync.Mutex
	via map[string]int
}

func (c *countingTracer) StartDecision(ctx context.Context, via string, _ httplimit.HeaderCarrier) (context.Context, httplimit.DecisionSpan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.via[via]++
	return ctx, noSpan{}
}

type noSpan struct{}

func (noSpan) End(*engine.Result, error) {}

// A message a stream receives runs the pipeline a call runs: a leaky
// queue's delay beyond MaxDelay is refused and its units given back, and it
// is traced. It is handed on within its stream's concurrency permit: a
// stream at the limit still gets its messages, while a call beside it is
// shed.
func TestAStreamsMessagesRunTheCallsPipeline(t *testing.T) {
	e := engineOf(t, `
rules:
  - {id: queue, match: {method: MESSAGE, path: "/grpc.reflection.v1.ServerReflection/*"}, key: [user], rate: 1, per: 1h, burst: 3, algorithm: leaky-queue}
`)
	tracer := &countingTracer{via: map[string]int{}}
	limit := concurrency.New(concurrency.Fixed{N: 1}, concurrency.Options{})
	l := grpclimit.New(e, grpclimit.Options{HTTP: httplimit.Options{MaxDelay: 100 * time.Millisecond, Tracer: tracer, Concurrency: limit}})
	s := grpc.NewServer(grpc.StreamInterceptor(l.StreamServerInterceptor()), grpc.UnaryInterceptor(l.UnaryServerInterceptor()))
	reflection.Register(s)
	conn := served(t, s)
	ctx, cancel := context.WithTimeout(withUser("q"), 10*time.Second)
	defer cancel()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func() error {
		if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			return err
		}
		_, err := st.Recv()
		return err
	}
	if err := ask(); err != nil {
		t.Fatalf("the first message, at once, within its stream's permit: %v", err)
	}
	if err := check(context.Background(), conn); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call beside a stream holding the one permit: %v, want Unavailable", err)
	}
	left := func() int64 {
		d, _, err := e.Inspect(context.Background(), "queue", "q")
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	before := left()
	if err := ask(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a message an hour away in the queue, beyond MaxDelay: %v, want ResourceExhausted", err)
	}
	if got := left(); got != before {
		t.Fatalf("the refused message kept its place in the queue: %d left, %d before", got, before)
	}
	tracer.mu.Lock()
	traced := tracer.via["grpc"]
	tracer.mu.Unlock()
	if traced != 4 { // the stream at open, its two messages, the call beside
		t.Fatalf("%d decisions traced, want 4: the stream, each message and the call", traced)
	}
}

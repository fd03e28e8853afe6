package envoy

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"runtime"
	"sort"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/metrics"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/tracing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// maxDescriptors bounds the descriptors of one Envoy request.
const maxDescriptors = 64

// Options configure the Envoy side.
type Options struct {
	// Engine decides; its rules may be in sluice's format or Envoy's
	// (domain and descriptors).
	Engine *engine.Engine
	// HTTP shapes the RateLimit fields Envoy is told to add to its
	// answers, as the middleware would write them.
	HTTP httplimit.Options
	// DynamicMetadata adds the reference service's dynamic metadata to
	// each answer (its RESPONSE_DYNAMIC_METADATA setting).
	DynamicMetadata bool
	// Metrics count the panics recovered; nil: metrics of its own.
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	// Tracer, if set, makes an OpenTelemetry span of each call, parented to
	// the caller's traceparent.
	Tracer *tracing.Tracer
	// QuotaFleet, if set, is the store the serve processes share, where
	// the quota service divides each bucket among them (rlqs.Options.Fleet).
	QuotaFleet rlqs.Fleet
}

// Service is Envoy's rate limit service over an engine
// (envoy.service.ratelimit.v3.RateLimitService), to serve on either gRPC
// server (NewGRPC).
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	o       Options
	limiter *httplimit.Limiter // renders the RateLimit fields
	quota   *rlqs.Service      // the Rate Limit Quota Service, beside it
}

// New returns the service for o.Engine.
func New(o Options) (*Service, error) {
	if o.Engine == nil {
		return nil, errors.New("envoy: Options.Engine is required")
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New("")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	quota, err := rlqs.New(rlqs.Options{Engine: o.Engine, Logger: o.Logger, Fleet: o.QuotaFleet})
	if err != nil {
		return nil, err
	}
	return &Service{o: o, limiter: httplimit.New(o.Engine, o.HTTP), quota: quota}, nil
}

// Quota is Envoy's Rate Limit Quota Service over the same rules, served
// beside ShouldRateLimit on either gRPC server.
func (x *Service) Quota() *rlqs.Service { return x.quota }

// newGRPCGo returns a grpc-go server of the service with sluice's panic
// boundary (unaryRecover) and settings for what a rate limit service
// receives: many small unary calls from few connections. Stream workers run
// each call on a long-lived goroutine, whose stack has already grown,
// instead of a new one per call (which grew its stack on every call: 8% of
// the CPU a call took in the profile of BenchmarkEnvoyGRPC); a shared write
// buffer keeps idle connections from holding one each. opts are appended.
func (s *Service) newGRPCGo(opts ...grpc.ServerOption) *grpc.Server {
	base := []grpc.ServerOption{
		grpc.UnaryInterceptor(unaryRecover(s.o.Metrics, s.o.Logger)),
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
		grpc.SharedWriteBuffer(true),
	}
	g := grpc.NewServer(append(base, opts...)...)
	rlsv3.RegisterRateLimitServiceServer(g, s)
	s.quota.Register(g)
	return g
}

// ShouldRateLimit decides a request's descriptors: statuses in descriptor
// order, OVER_LIMIT overall if any descriptor is over, and the RateLimit and
// Retry-After fields in response_headers_to_add for Envoy to send.
func (x *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	sc := envoyScratch.Get().(*envoyState)
	defer envoyScratch.Put(sc)
	return x.decide(ctx, req, sc, nil)
}

// decide is ShouldRateLimit with the call's scratch: the request's
// descriptors, the engine's decision, the answer. The answer's messages
// come from a when it is not nil, and are then valid only until a is reused:
// for a caller that encodes the answer before it returns (the h2grpc
// server); grpc-go encodes after the method returns, so it gets fresh ones.
func (x *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, sc *envoyState, a *answerArena) (*rlsv3.RateLimitResponse, error) {
	descs, err := descriptors(req, sc)
	if err != nil {
		return nil, err
	}
	res := &sc.res
	var span tracing.Span
	if x.o.Tracer != nil {
		md, _ := metadata.FromIncomingContext(ctx) // a copy: only when tracing
		ctx, span = x.o.Tracer.Start(ctx, "envoy", tracing.MetadataCarrier(md))
	}
	span.SetDomain(req.Domain)
	err = x.o.Engine.CheckDescriptors(ctx, req.Domain, descs, res)
	span.End(res, err)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp := a.response()
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if !res.Allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i := range res.Statuses {
		resp.Statuses = append(resp.Statuses, descriptorStatus(&res.Statuses[i], a))
	}
	if x.o.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, res)
	}
	x.addHeaders(resp, res, sc, a)
	return resp, nil
}

// descriptors checks the request and turns its descriptors into the
// engine's, in sc's buffers: at most maxDescriptors, each with entries, the
// request's hits_addend (1 when unset) unless the descriptor sets its own.
func descriptors(req *rlsv3.RateLimitRequest, sc *envoyState) ([]engine.Descriptor, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "domain is required")
	}
	if n := len(req.GetDescriptors()); n == 0 || n > maxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "want 1 to %d descriptors, got %d", maxDescriptors, n)
	}
	hits := int64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1
	}
	descs := sc.descs[:0]
	entries := sc.entries[:0]
	for _, d := range req.Descriptors {
		for _, e := range d.Entries {
			entries = append(entries, rules.EnvoyEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	sc.entries = entries
	for i, d := range req.Descriptors {
		if len(d.GetEntries()) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d] has no entries", i)
		}
		ed := engine.Descriptor{Hits: hits, Negative: d.GetIsNegativeHits()}
		ed.Entries, entries = entries[:len(d.Entries):len(d.Entries)], entries[len(d.Entries):]
		if h := d.GetHitsAddend(); h != nil {
			// Set on the descriptor, 0 is a check that consumes nothing.
			ed.Hits, ed.HitsSet = int64(min(h.GetValue(), 1<<40)), true
		}
		if o := d.GetLimit(); o != nil {
			l, err := overrideLimit(o)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d].limit: %v", i, err)
			}
			ed.Limit = &l
		}
		descs = append(descs, ed)
	}
	sc.descs = descs
	return descs, nil
}

// descriptorStatus is one descriptor's status as the reference service
// answers it: its code, its limit (named as the reference names it),
// what is left and when it resets.
func descriptorStatus(st *engine.Status, a *answerArena) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := a.status()
	ds.Code = rlsv3.RateLimitResponse_OK
	if st.Unlimited {
		ds.LimitRemaining = math.MaxUint32 // as the reference service answers
	}
	if !st.Allowed && !st.Shadow {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT // a shadow descriptor's own code stays OK
	}
	if st.Rule == "" {
		return ds
	}
	unit, mult := unitOf(st.Limit.Period)
	// As the reference service: the limit's name (rate_limit.name), and for
	// sluice-format rules their id.
	name, perUnit := st.Rule, uint32(min(st.Limit.Rate, 1<<32-1))
	if def := st.RuleDef(); def != nil && def.Envoy != nil {
		name = def.Envoy.Name
		if def.Envoy.Deny {
			perUnit = 0
		}
	}
	ds.CurrentLimit = a.limit()
	ds.CurrentLimit.Name, ds.CurrentLimit.RequestsPerUnit, ds.CurrentLimit.Unit = name, perUnit, unit
	if mult > 1 {
		ds.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(uint32(min(mult, 1<<32-1)))
	}
	ds.LimitRemaining = uint32(min(max(st.Remaining, 0), 1<<32-1))
	if ds.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
		ds.LimitRemaining = 0
	}
	ds.DurationUntilReset = a.duration(st.ResetAfter)
	return ds
}

// addHeaders adds the RateLimit fields (and Retry-After) for Envoy to send,
// in a stable order, response after response.
func (x *Service) addHeaders(resp *rlsv3.RateLimitResponse, res *engine.Result, sc *envoyState, a *answerArena) {
	if sc.header == nil {
		sc.header = http.Header{}
	}
	h := sc.header
	clear(h)
	x.limiter.Headers(h, res)
	names, n := sc.names[:0], 0
	for k, vs := range h {
		names = append(names, k)
		n += len(vs)
	}
	sort.Strings(names)
	sc.names = names
	values := a.headerValues(n) // never grown: the pointers into it stay valid
	for _, k := range names {
		for _, v := range h[k] {
			values = append(values, corev3.HeaderValue{Key: httplimit.DisplayName(k), Value: v})
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &values[len(values)-1])
		}
	}
}

// dynamicMetadata is the reference service's response metadata: the domain,
// the descriptors, the request's hits_addend, and the merged metadata of the
// descriptors that passed.
func dynamicMetadata(req *rlsv3.RateLimitRequest, res *engine.Result) *structpb.Struct {
	fields := map[string]any{"domain": req.GetDomain()}
	var descs []any
	for _, d := range req.GetDescriptors() {
		var entries []any
		for _, e := range d.GetEntries() {
			entries = append(entries, map[string]any{"key": e.GetKey(), "value": e.GetValue()})
		}
		descs = append(descs, map[string]any{"entries": entries})
	}
	fields["descriptors"] = descs
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = float64(h)
	}
	passed := map[string]any{}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if def := st.RuleDef(); def != nil && def.Envoy != nil && st.Allowed && def.Envoy.Metadata != nil {
			for k, v := range def.Envoy.Metadata {
				passed[k] = v
			}
		}
	}
	if len(passed) > 0 {
		fields["metadata"] = passed
	}
	s, err := structpb.NewStruct(fields)
	if err != nil {
		return nil
	}
	return s
}

// envoyState is one call's scratch, pooled: a call's result and descriptors
// are not kept past the answer.
type envoyState struct {
	res     engine.Result
	descs   []engine.Descriptor
	entries []rules.EnvoyEntry
	header  http.Header // the limit's response fields, copied into the answer
	names   []string
	answer  answerArena // the answer's messages, for the h2grpc server
}

var envoyScratch = sync.Pool{New: func() any { return new(envoyState) }}

// overrideLimit reads a descriptor's own limit (its descriptor limit).
func overrideLimit(o *ratelimitcommonv3.RateLimitDescriptor_RateLimitOverride) (sluice.Limit, error) {
	var period time.Duration
	switch o.GetUnit() {
	case typev3.RateLimitUnit_SECOND:
		period = time.Second
	case typev3.RateLimitUnit_MINUTE:
		period = time.Minute
	case typev3.RateLimitUnit_HOUR:
		period = time.Hour
	case typev3.RateLimitUnit_DAY:
		period = 24 * time.Hour
	case typev3.RateLimitUnit_MONTH:
		period, _ = rules.EnvoyPeriod("month")
	case typev3.RateLimitUnit_YEAR:
		period, _ = rules.EnvoyPeriod("year")
	default:
		return sluice.Limit{}, status.Errorf(codes.InvalidArgument, "unit %v", o.GetUnit())
	}
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		period *= time.Duration(m.GetValue())
	}
	l := sluice.Limit{Rate: int64(o.GetRequestsPerUnit()), Period: period, Algorithm: sluice.FixedWindow}
	return l, l.Validate()
}

// unitOf writes a period in Envoy's terms: the largest unit that divides it,
// and how many of it (unit_multiplier): 15 minutes is MINUTE x 15. A period
// under a second, or not a whole number of seconds, is SECOND x 1 (rounded
// up).
func unitOf(d time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, int64) {
	for _, u := range []struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
		{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if d >= u.d && d%u.d == 0 {
			return u.unit, int64(d / u.d)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_SECOND, int64((d + time.Second - 1) / time.Second)
}

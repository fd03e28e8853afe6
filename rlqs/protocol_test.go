package rlqs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice/internal/testkit/rlqstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// rawStream opens a stream on which a test sends what it likes.
func (q *quotaTest) rawStream() rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	q.t.Cleanup(cancel)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(q.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		q.t.Fatal(err)
	}
	return st
}

func usage(bucket map[string]string, elapsed time.Duration, allowed uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqsv3.BucketId{Bucket: bucket}, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed,
	}
}

// refusedWith sends m as the stream's report(s) and wants the stream ended
// with code and a message holding want.
func refusedWith(t *testing.T, st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, code codes.Code, want string, ms ...*rlqsv3.RateLimitQuotaUsageReports) {
	t.Helper()
	for _, m := range ms {
		if err := st.Send(m); err != nil {
			break // the server may have ended the stream already
		}
	}
	for {
		_, err := st.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
			t.Fatalf("stream ended with %v, want %v with %q", err, code, want)
		}
		return
	}
}

func TestBadReportsEndTheirStreamWithAClearStatusAndNothingElse(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{MaxBucketsPerStream: 3})
	shared := map[string]string{"name": "shared"}
	bystander := q.envoy("bystander", "quota", shared)
	bystander.Report()
	q.settle()
	cases := []struct {
		name string
		code codes.Code
		want string
		ms   []*rlqsv3.RateLimitQuotaUsageReports
	}{
		{"no domain first", codes.InvalidArgument, "first report must name the domain",
			[]*rlqsv3.RateLimitQuotaUsageReports{{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(shared, 0, 0)}}}},
		{"unknown domain", codes.InvalidArgument, `unknown domain "nope"`,
			[]*rlqsv3.RateLimitQuotaUsageReports{{Domain: "nope", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(shared, 0, 0)}}}},
		{"domain changed", codes.InvalidArgument, "keeps the domain of its first report", []*rlqsv3.RateLimitQuotaUsageReports{
			{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(shared, 0, 0)}},
			{Domain: "other", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(shared, time.Second, 0)}}}},
		{"empty bucket id", codes.InvalidArgument, "bucket_quota_usages[0]: bucket_id has no fields",
			[]*rlqsv3.RateLimitQuotaUsageReports{{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(nil, 0, 0)}}}},
		{"empty key", codes.InvalidArgument, "empty key",
			[]*rlqsv3.RateLimitQuotaUsageReports{{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"": "x"}, 0, 0)}}}},
		{"huge value", codes.InvalidArgument, "at most 4096",
			[]*rlqsv3.RateLimitQuotaUsageReports{{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"name": strings.Repeat("v", 5000)}, 0, 0)}}}},
		{"large id", codes.InvalidArgument, "6004 bytes of keys and values, at most 4096",
			[]*rlqsv3.RateLimitQuotaUsageReports{{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"a": strings.Repeat("v", 3001), "b": strings.Repeat("v", 3001)}, 0, 0)}}}},
		{"negative time", codes.InvalidArgument, "time_elapsed",
			[]*rlqsv3.RateLimitQuotaUsageReports{{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(shared, -time.Second, 0)}}}},
		{"too many buckets", codes.ResourceExhausted, "at most 3 are taken on one stream", []*rlqsv3.RateLimitQuotaUsageReports{
			{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"name": "1"}, 0, 0), usage(map[string]string{"name": "2"}, 0, 0)}},
			{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"name": "3"}, 0, 0), usage(map[string]string{"name": "4"}, 0, 0)}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			refusedWith(t, q.rawStream(), c.code, c.want, c.ms...)
		})
	}
	// The bystander's stream went on: its next report is answered.
	q.clock.Advance(time.Second)
	before := bystander.Received()
	bystander.Report()
	waitFor(t, "the bystander's answer", func() bool { return bystander.Received() > before })
	if st := q.svc.Stats(); st.Refused != uint64(len(cases)) || st.Subscriptions != 1 {
		t.Fatalf("stats %+v: want %d refused and the bystander's one subscription left", st, len(cases))
	}
}

func TestBucketIdsAreOneBucketWhateverTheOrderOfTheirFields(t *testing.T) {
	a, _, err := canonical("d", &rlqsv3.BucketId{Bucket: map[string]string{"x": "1", "y": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 { // Go's map order differs from run to run
		b, entries, _ := canonical("d", &rlqsv3.BucketId{Bucket: map[string]string{"y": "2", "x": "1"}})
		if a != b || entries[0].Key != "x" {
			t.Fatalf("%q and %q name one bucket", a, b)
		}
	}
	// Length prefixes: fields that concatenate alike are apart.
	c, _, _ := canonical("d", &rlqsv3.BucketId{Bucket: map[string]string{"x": "1y"}})
	d, _, _ := canonical("d", &rlqsv3.BucketId{Bucket: map[string]string{"x": "1", "y": ""}})
	e, _, _ := canonical("dx", &rlqsv3.BucketId{Bucket: map[string]string{"": "1"}})
	if c == d || c == e || a == c {
		t.Fatal("different buckets share a name")
	}
}

func TestAnUnchangedShareOnlyExtendsTheAssignment(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{})
	e := q.envoy("steady", "quota", map[string]string{"name": "shared"})
	e.Report()
	q.settle()
	var first *typev3.RateLimitStrategy
	for i := range 20 {
		for range 5 { // 5/s, steady
			q.clock.Advance(200 * time.Millisecond)
			e.Request()
		}
		e.Report()
		q.settle()
		if i == 2 {
			first = e.Strategy()
		}
		if now := e.Strategy(); i > 2 && !proto.Equal(first, now) {
			t.Fatalf("report %d: the assignment changed from %v to %v under steady demand", i, first, now)
		}
	}
	if n := len(e.Fills()); n > 3 {
		t.Fatalf("the bucket was handed out full %d times under steady demand", n)
	}
	if got := e.Received(); got < 21 {
		t.Fatalf("%d responses to 21 reports: each report is answered, a renewal at least", got)
	}
}

func TestABucketNoRuleLimitsIsAllowedAll(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{})
	e := q.envoy("free", "quota", map[string]string{"name": "other"})
	e.Report()
	q.settle()
	if s := e.Strategy(); s.GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL || s.GetTokenBucket() != nil {
		t.Fatalf("a bucket no rule limits got %v, want ALLOW_ALL", s)
	}
}

func TestPastTheServersBoundANewBucketIsAbandonedAndTheStreamGoesOn(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{MaxSubscriptions: 1})
	e := q.envoy("first", "quota", map[string]string{"name": "shared"})
	e.Report()
	q.settle()
	st := q.rawStream()
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"name": "more"}, 0, 0)}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if a := resp.GetBucketAction(); len(a) != 1 || a[0].GetAbandonAction() == nil || a[0].GetBucketId().GetBucket()["name"] != "more" {
		t.Fatalf("got %v, want the new bucket abandoned", resp)
	}
	if s := q.svc.Stats(); s.Abandoned != 1 || s.Subscriptions != 1 || s.Streams != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// A client that reports and never reads: what waits for it is one action
// per bucket, the latest, however many reports it sends; the others are
// answered meanwhile.
func TestAStreamThatNeverReadsHoldsOneActionPerBucket(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{})
	other := q.envoy("reader", "quota", map[string]string{"name": "shared"})
	other.Report()
	q.settle()
	st := q.rawStream()
	first := true
	maxPending := int64(0)
	for i := range 4000 {
		q.clock.Advance(60 * time.Millisecond) // past minGap: each report answered
		m := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"name": "shared"}, 60*time.Millisecond, uint64(i%7)),
			usage(map[string]string{"name": "free"}, 60*time.Millisecond, 1)}}
		if first {
			m.Domain, first = "quota", false
		}
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		maxPending = max(maxPending, q.svc.Stats().Pending)
	}
	// One waiting per subscription, and one in the response being sent.
	if maxPending > 2*3 {
		t.Fatalf("%d actions waited for 3 subscriptions (2 of the stream that does not read)", maxPending)
	}
	before := other.Received()
	other.Report()
	waitFor(t, "the reading Envoy's answer while another stream does not read", func() bool { return other.Received() > before })
}

// waitFor waits for an event the test cannot be told of, polling; it fails
// after 30 s rather than hang.
func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in 30 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Past the memory the server gives buckets, a new bucket is abandoned as
// past the count; a stream that goes on reporting new buckets to a full
// server is ended once it has been answered 16 abandoned ones.
func TestPastTheBucketsMemoryNewBucketsAreAbandonedThenTheStreamEnded(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{MaxBucketBytes: 2000})
	st := q.rawStream()
	var batch []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range 40 {
		batch = append(batch, usage(map[string]string{"name": fmt.Sprintf("b%04d", i)}, 0, 0))
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: batch[:18]}); err != nil {
		t.Fatal(err)
	}
	name, _, _ := canonical("quota", batch[0].GetBucketId())
	held := int(2000 / bucketCost(name)) // 3 of these
	abandoned := 0
	for abandoned < 18-held {
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range resp.GetBucketAction() {
			if a.GetAbandonAction() != nil {
				abandoned++
			}
		}
	}
	if s := q.svc.Stats(); s.Buckets != held || s.Abandoned != uint64(18-held) {
		t.Fatalf("stats %+v: want %d buckets held, the others abandoned", s, held)
	}
	refusedWith(t, st, codes.ResourceExhausted, "as many buckets as it takes", &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: batch[18:]})
}

// A client that half-closes after its report still gets the answer to it.
func TestAHalfClosedStreamIsAnswered(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{})
	for i := range 20 {
		st := q.rawStream()
		if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"name": "shared"}, 0, 0)}}); err != nil {
			t.Fatal(err)
		}
		st.CloseSend()
		resp, err := st.Recv()
		if err != nil || resp.GetBucketAction()[0].GetQuotaAssignmentAction() == nil {
			t.Fatalf("stream %d: %v %v, want its assignment before the end", i, resp, err)
		}
	}
}

// A stream that leaves keeps its grant until its TTL ends; one that comes
// to the bucket meanwhile, alone, gets only what that grant leaves, even
// though the bucket has no member between them.
func TestAGrantOfAStreamThatLeftStillCountsWhenTheBucketEmpties(t *testing.T) {
	q := newQuotaTest(t, sharedRule, Options{})
	bucket := map[string]string{"name": "shared"}
	a := q.envoy("a", "quota", bucket)
	a.Report()
	q.settle()
	for range 3 {
		for range 40 {
			q.clock.Advance(25 * time.Millisecond)
			a.Request()
		}
		a.Report()
		q.settle()
	}
	q.leave(a)
	b := q.envoy("b", "quota", bucket)
	for range 2 {
		for range 40 {
			q.clock.Advance(5 * time.Millisecond)
			b.Request()
		}
		b.Report()
		q.settle()
	}
	if sum := fillOf(a) + fillOf(b); sum > 10*(1-keptBack)+1e-9 {
		t.Fatalf("a (gone, its grant alive) fills %.2f/s and b %.2f/s: %.2f above the %.2f divided", fillOf(a), fillOf(b), sum, 10*(1-keptBack))
	}
}

func fillOf(e *rlqstest.Envoy) float64 {
	tb := e.Strategy().GetTokenBucket()
	if tb == nil {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
}

// An envoyproxy/ratelimit file's unlimited descriptor is ALLOW_ALL, its
// requests_per_unit 0 DENY_ALL, and a shadow one ALLOW_ALL (counted by
// RLS, never enforced).
func TestBlanketAnswersFollowTheRule(t *testing.T) {
	q := newQuotaTest(t, `domain: quota
descriptors:
  - key: name
    value: open
    rate_limit: {unlimited: true}
  - key: name
    value: closed
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: name
    value: watched
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
`, Options{})
	for name, want := range map[string]typev3.RateLimitStrategy_BlanketRule{
		"open": typev3.RateLimitStrategy_ALLOW_ALL, "closed": typev3.RateLimitStrategy_DENY_ALL, "watched": typev3.RateLimitStrategy_ALLOW_ALL,
	} {
		e := q.envoy(name, "quota", map[string]string{"name": name})
		e.Report()
		q.settle()
		if s := e.Strategy(); s == nil || s.GetTokenBucket() != nil || s.GetBlanketRule() != want {
			t.Errorf("bucket %s got %v, want %v", name, s, want)
		}
	}
}

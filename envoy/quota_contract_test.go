package envoy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The Rate Limit Quota Service's cases of the gRPC server contract: its
// bidirectional stream served alike by every server, bounded alike.

func quotaReport(domain, value string, elapsed time.Duration, n uint64) *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"quota": value}},
		TimeElapsed:        durationpb.New(elapsed),
		NumRequestsAllowed: n,
	}}}
}

func quotaStream(t *testing.T, addr string) (rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(grpcClient(t, addr)).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st, cancel
}

// fillRate is the token bucket rate an action assigns, a second.
func fillRate(a *rlqsv3.RateLimitQuotaResponse_BucketAction) float64 {
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return -1
	}
	return float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
}

var quotaContractCases = []contractCase{
	{"the quota stream divides a bucket among its Envoys and refuses a bad stream", func(t *testing.T, kind string) {
		f := startGRPC(t, kind, GRPCOptions{})
		a, _ := quotaStream(t, f.addr)
		b, _ := quotaStream(t, f.addr)
		if err := a.Send(quotaReport("load", "q", 0, 0)); err != nil {
			t.Fatal(err)
		}
		first, err := a.Recv()
		if err != nil || fillRate(first.GetBucketAction()[0]) <= 0 {
			t.Fatalf("first Envoy: %v %v, want a token bucket", first, err)
		}
		// The second Envoy, busy: the two fill rates never sum above the
		// rule's 100 a second.
		if err := b.Send(quotaReport("load", "q", time.Second, 500)); err != nil {
			t.Fatal(err)
		}
		rates := map[string]float64{}
		deadline := time.Now().Add(20 * time.Second)
		for rates["b"] <= 0 || rates["a"] >= fillRate(first.GetBucketAction()[0]) {
			if time.Now().After(deadline) {
				t.Fatalf("rates %v: want b granted and a shrunk", rates)
			}
			resp, err := b.Recv()
			if err != nil {
				t.Fatal(err)
			}
			rates["b"] = fillRate(resp.GetBucketAction()[0])
			ra, err := a.Recv()
			if err != nil {
				t.Fatal(err)
			}
			rates["a"] = fillRate(ra.GetBucketAction()[0])
		}
		if rates["a"]+rates["b"] > 100 {
			t.Fatalf("rates %v sum above the limit of 100/s", rates)
		}
		c, _ := quotaStream(t, f.addr)
		c.Send(quotaReport("nope", "q", 0, 0))
		if _, err := c.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("unknown domain: %v, want InvalidArgument", err)
		}
	}},
	{"shutdown ends open quota streams as UNAVAILABLE", func(t *testing.T, kind string) {
		f := startGRPC(t, kind, GRPCOptions{})
		st, _ := quotaStream(t, f.addr)
		if err := st.Send(quotaReport("load", "q", 0, 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			f.g.Shutdown(ctx)
		}()
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		select {
		case err := <-ended:
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("the stream ended with %v, want UNAVAILABLE (open it again elsewhere)", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("an open quota stream held the shutdown for 20 s")
		}
	}},
	{"a quota stream whose client grants no window ends its connection", func(t *testing.T, kind string) {
		f := startGRPC(t, kind, GRPCOptions{RequestTimeout: time.Second})
		r := dialH2(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		r.settled(t)
		r.headers(1, "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", false)
		r.fr.WriteData(1, false, grpcFrame(t, quotaReport("load", "q", 0, 0)))
		var reports atomic.Int64
		go func() { // and it goes on reporting, never reading
			for i := range 50 {
				if r.fr.WriteData(1, false, grpcFrame(t, quotaReport("", "q", time.Second, uint64(i)))) != nil {
					return
				}
				reports.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
		}()
		if err := r.untilClosed(20 * time.Second); err != nil {
			t.Fatalf("%v after %d reports: want the connection ended (its answer unread past RequestTimeout)", err, reports.Load())
		}
		// And its stream with it: the service forgets it and its bucket.
		for end := time.Now().Add(20 * time.Second); f.svc.Quota().Stats().Streams != 0 || f.svc.Quota().Stats().Subscriptions != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("20 s after its connection ended the service still serves its stream: %+v", f.svc.Quota().Stats())
			}
		}
	}},
}

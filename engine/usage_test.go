package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// The quota descriptors of envoyproxy/ratelimit's example configuration,
// which its integration tests token-quota.sh, multiservice-tokenquota.sh and
// quota.sh run against.
const quotaConfig = `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`

func quotaEngine(t *testing.T) (*Engine, *sluice.ManualClock) {
	t.Helper()
	cfg, err := rules.Parse("rl.yaml", []byte(quotaConfig))
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(epoch)
	e, err := New(cfg, Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e, clock
}

// hits is a descriptor with its own hits_addend.
func hits(n int64, kv ...string) Descriptor {
	d := desc(kv...)
	d.Hits, d.HitsSet = n, true
	return d
}

func (e *Engine) quotaCall(t *testing.T, ds ...Descriptor) *Result {
	t.Helper()
	var res Result
	if err := e.CheckDescriptors(context.Background(), "rl", ds, &res); err != nil {
		t.Fatal(err)
	}
	return &res
}

// token-quota.sh: each request is checked with 0 hits, and its usage (1) is
// reported once it is done. A limit of 2 per minute: the third request's
// check finds the count at the limit and passes, its report takes the count
// over it, and the fourth request is refused; a minute later, it passes.
func TestUsageReportsHoldATokenQuota(t *testing.T) {
	e, clock := quotaEngine(t)
	for i := 1; i <= 4; i++ {
		r := e.quotaCall(t, hits(0, "service", "service_2"))
		if want := i <= 3; r.Allowed != want {
			t.Fatalf("request %d: allowed %v, want %v: %+v", i, r.Allowed, want, r.Statuses[0])
		}
		if i == 4 {
			break
		}
		report := e.quotaCall(t, hits(1, "service", "service_2"))
		if st := report.Statuses[0]; (st.Allowed != (i <= 2)) || st.Remaining != int64(max(2-i, 0)) {
			t.Fatalf("usage report %d: %+v, want allowed %v with %d left", i, st.Decision, i <= 2, max(2-i, 0))
		}
	}
	// The report beyond the limit was charged: a debt, not a refusal that
	// counted nothing.
	if r := e.quotaCall(t, desc("service", "service_2")); r.Allowed {
		t.Fatal("a request of 1 hit after the budget was spent passed")
	}
	clock.Advance(time.Minute)
	if r := e.quotaCall(t, hits(0, "service", "service_2")); !r.Allowed {
		t.Fatalf("a minute later, the quota is not back: %+v", r.Statuses[0])
	}
}

// multiservice-tokenquota.sh: two quota descriptors checked with 0 hits (1
// and 2 per minute), the usage reported on whichever service served the
// request. Service 1 serves until its check is over, then service 2; the
// sixth request finds both over and is refused.
func TestUsageReportsMoveTrafficBetweenQuotas(t *testing.T) {
	e, _ := quotaEngine(t)
	served := []string{}
	for i := 1; i <= 6; i++ {
		r := e.quotaCall(t, hits(0, "service", "service_1"), hits(0, "service", "service_2"))
		if !r.Allowed {
			if i != 6 {
				t.Fatalf("request %d refused: %+v", i, r.Statuses)
			}
			break
		}
		if i == 6 {
			t.Fatalf("request 6 passed: %+v", r.Statuses)
		}
		svc := "service_1"
		if !r.Statuses[0].Allowed {
			svc = "service_2"
		}
		served = append(served, svc)
		e.quotaCall(t, hits(1, "service", svc))
	}
	want := []string{"service_1", "service_1", "service_2", "service_2", "service_2"}
	if len(served) != len(want) {
		t.Fatalf("served by %v, want %v", served, want)
	}
	for i := range want {
		if served[i] != want[i] {
			t.Fatalf("served by %v, want %v", served, want)
		}
	}
}

// quota.sh: both quota descriptors take 1 hit each (no hits_addend of their
// own): all or nothing per descriptor, as every sluice API takes. The third
// request finds both over and is refused.
func TestQuotaDescriptorsWithoutUsageReports(t *testing.T) {
	e, _ := quotaEngine(t)
	for i := 1; i <= 3; i++ {
		r := e.quotaCall(t, desc("service", "service_1"), desc("service", "service_2"))
		if want := i <= 2; r.Allowed != want {
			t.Fatalf("request %d: allowed %v, want %v: %+v", i, r.Allowed, want, r.Statuses)
		}
	}
}

// Usage reports for two descriptors in one call: each is answered by the
// look at its own key after its charge, the second's too.
func TestEachUsageReportIsAnsweredByItsOwnLook(t *testing.T) {
	e, _ := quotaEngine(t)
	res := e.quotaCall(t, hits(1, "service", "service_1"), hits(3, "service", "service_2"))
	if len(res.Statuses) != 2 || res.Statuses[1].Allowed || res.Statuses[1].Remaining != 0 {
		t.Fatalf("3 hits reported on a limit of 2: %+v, want over the limit", res.Statuses)
	}
	if !res.Statuses[0].Allowed || res.Statuses[0].Remaining != 0 {
		t.Fatalf("1 hit reported on a limit of 1: %+v, want at the limit, not over", res.Statuses[0])
	}
}

package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/storecall"
)

const parityConfig = `domain: p
descriptors:
  - key: key2
    value: vip
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: block
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: pat
    value: foo*
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: pat
    value: f*
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func parityEngine(t *testing.T, extra string) *Engine {
	t.Helper()
	c1, err := rules.Parse("p.yaml", []byte(parityConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg := c1
	if extra != "" {
		c2, err := rules.Parse("s.yaml", []byte(extra))
		if err != nil {
			t.Fatal(err)
		}
		if cfg, err = rules.Merge(c1, c2); err != nil {
			t.Fatal(err)
		}
	}
	e, err := New(cfg, Options{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch))), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *Engine) checkOne(t *testing.T, ds ...Descriptor) *Result {
	t.Helper()
	var res Result
	if err := e.CheckDescriptors(context.Background(), "p", ds, &res); err != nil {
		t.Fatal(err)
	}
	return &res
}

// The reference service's behaviours, at the engine: whitelisting,
// requests_per_unit 0, unlimited, share_threshold, the first matching
// pattern, quota_mode and a check with 0 hits.
func TestEnvoyParityAtTheEngine(t *testing.T) {
	e := parityEngine(t, "")
	for range 5 {
		if r := e.checkOne(t, desc("key2", "vip")); !r.Allowed || r.Statuses[0].Rule != "" {
			t.Fatalf("whitelisted: %+v", r.Statuses[0])
		}
	}
	if r := e.checkOne(t, desc("block", "x")); r.Allowed || r.Statuses[0].Rule == "" {
		t.Fatalf("requests_per_unit 0: %+v", r.Statuses[0])
	}
	// Its reset is the end of the current hour, as the reference answers
	// (an hour less the time since the hour began), not a whole hour.
	before := time.Now()
	st := e.checkOne(t, desc("block", "x")).Statuses[0]
	after := time.Now()
	sinceHour := func(at time.Time) time.Duration { return time.Duration(at.UnixNano() % int64(time.Hour)) }
	if lo, hi := time.Hour-sinceHour(after), time.Hour-sinceHour(before); sinceHour(after) >= sinceHour(before) && (st.ResetAfter < lo || st.ResetAfter > hi) {
		t.Errorf("requests_per_unit 0: reset after %v, want the rest of the hour, between %v and %v", st.ResetAfter, lo, hi)
	}
	if r := e.checkOne(t, desc("free", "x")); !r.Allowed || !r.Statuses[0].Unlimited {
		t.Fatalf("unlimited: %+v", r.Statuses[0])
	}
	e.checkOne(t, desc("files", "files/a"))
	e.checkOne(t, desc("files", "files/b"))
	if r := e.checkOne(t, desc("files", "files/c")); r.Allowed {
		t.Fatal("share_threshold: a third value under files/* admitted")
	}
	if r := e.checkOne(t, desc("pat", "foo1")); r.Statuses[0].Limit.Rate != 1 {
		t.Fatalf("the first matching pattern (foo*) should win: %+v", r.Statuses[0].Limit)
	}
	e.checkOne(t, desc("q1", "a"), desc("q2", "a"))
	if r := e.checkOne(t, desc("q1", "a"), desc("q2", "a")); r.Allowed {
		t.Fatal("quota_mode: every quota descriptor over, yet allowed")
	}
	if r := e.checkOne(t, desc("q1", "b"), desc("q2", "a")); !r.Allowed {
		t.Fatal("quota_mode: one quota of two over, yet refused")
	}
	zero := desc("key2", "z")
	zero.HitsSet = true
	for range 5 {
		if r := e.checkOne(t, zero); !r.Allowed {
			t.Fatal("a check with 0 hits was refused")
		}
	}
	if r := e.checkOne(t, desc("key2", "z")); r.Statuses[0].Remaining != 1 {
		t.Fatalf("0 hits consumed: %+v", r.Statuses[0])
	}
}

// A descriptor limit on a configured rule counts under that rule, with its
// algorithm.
func TestOverrideCountsUnderItsRule(t *testing.T) {
	e := parityEngine(t, "rules:\n  - {id: g, key: [user], rate: 5, per: 1h, algorithm: gcra, envoy: {domain: p, descriptors: [{key: g}]}}\n")
	d := desc("g", "v")
	l := sluice.Limit{Rate: 2, Period: time.Hour, Algorithm: sluice.FixedWindow}
	d.Limit = &l
	r := e.checkOne(t, d)
	if st := r.Statuses[0]; st.Rule != "g" || st.Limit.Algorithm != sluice.GCRA || st.Limit.Rate != 2 {
		t.Fatalf("override on rule g: %+v", st.Decision)
	}
	e.checkOne(t, d)
	if r := e.checkOne(t, d); r.Allowed {
		t.Fatal("the override of 2 admitted a third")
	}
}

// A huge penalty count uses the sliding window counter, a small one the
// log.
func TestPenaltyCountAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		after int64
		want  sluice.Algorithm
	}{{sluice.MaxLogLimit, sluice.SlidingLog}, {sluice.MaxLogLimit + 1, sluice.SlidingWindow}} {
		cfg := mustRules(t, "rules:\n  - {id: r, key: [user], rate: 1, per: 1h, penalty: {after: "+itoa(tc.after)+", block: 1m}}\n")
		rs := compile(cfg)
		if got := rs.rules[0].rejectsLimit.Algorithm; got != tc.want {
			t.Errorf("after %d: %v, want %v", tc.after, got, tc.want)
		}
	}
}

// The logger given is the one used.
func TestTheGivenLoggerIsUsed(t *testing.T) {
	var buf bytes.Buffer
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 5, per: 1m}\n", Options{Calls: storecall.Options{BreakerFailures: 1, BreakerOpenFor: time.Hour}})
	e, _ := New(f.e.Config(), Options{Store: f.store, Logger: slog.New(slog.NewTextHandler(&buf, nil)), Calls: storecall.Options{BreakerFailures: 1, BreakerOpenFor: time.Hour}})
	f.store.mode.Store(1)
	var res Result
	e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	if !strings.Contains(buf.String(), "circuit breaker") {
		t.Fatalf("the breaker's transition was not logged to the given logger: %q", buf.String())
	}
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

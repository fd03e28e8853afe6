package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

func envoyEngine(t *testing.T) *Engine {
	t.Helper()
	cfg, err := rules.Load("../examples/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, Options{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch))), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func desc(kv ...string) Descriptor {
	var d Descriptor
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, rules.EnvoyEntry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestDescriptorsMatchTheMostSpecificValue(t *testing.T) {
	e := envoyEngine(t)
	var res Result
	ctx := context.Background()
	for _, tc := range []struct {
		d    Descriptor
		rule string
	}{
		{desc("remote_address", "203.0.113.7"), "edge.remote_address"},
		{desc("api_key", "k1", "path", "/login"), "edge.login"},
		{desc("api_key", "k1", "path", "/export/all"), "edge.api_key.path__export__"},
		{desc("api_key", "k1", "path", "/items"), "edge.api_key.path"},
		{desc("api_key", "k1"), ""},                       // no limit at depth 1 for api_key alone
		{desc("source", "internal"), ""},                  // unlimited
		{desc("source", "external"), ""},                  // no rule
		{desc("nobody", "x"), ""},                         // no rule
		{desc("remote_address", "1.2.3.4", "x", "y"), ""}, // deeper than the tree
	} {
		if err := e.CheckDescriptors(ctx, "edge", []Descriptor{tc.d}, &res); err != nil {
			t.Fatal(err)
		}
		if got := res.Statuses[0].Rule; got != tc.rule || !res.Statuses[0].Allowed {
			t.Errorf("%v: rule %q allowed %v, want %q", tc.d.Entries, got, res.Statuses[0].Allowed, tc.rule)
		}
	}
}

func TestDescriptorsCountHitsRefundsAndOverrides(t *testing.T) {
	e := envoyEngine(t)
	var res Result
	ctx := context.Background()
	login := desc("api_key", "k1", "path", "/login")
	login.Hits = 4
	e.CheckDescriptors(ctx, "edge", []Descriptor{login}, &res)
	if res.Statuses[0].Remaining != 1 {
		t.Fatalf("hits 4 of 5: %+v", res.Statuses[0].Decision)
	}
	login.Hits = 2
	e.CheckDescriptors(ctx, "edge", []Descriptor{login, desc("remote_address", "203.0.113.7")}, &res)
	if res.Allowed || res.Statuses[0].Allowed || res.Decision.Rule != "edge.login" {
		t.Fatalf("over the limit: %+v", res.Statuses)
	}
	if res.Statuses[1].Remaining != 60 { // all or nothing: the other descriptor took nothing
		t.Fatalf("the denied request consumed from remote_address: %+v", res.Statuses[1].Decision)
	}
	back := desc("api_key", "k1", "path", "/login")
	back.Hits, back.Negative = 3, true
	e.CheckDescriptors(ctx, "edge", []Descriptor{back}, &res)
	login.Hits = 2
	if e.CheckDescriptors(ctx, "edge", []Descriptor{login}, &res); !res.Allowed {
		t.Fatalf("after giving 3 back, 2 more: %+v", res.Statuses[0].Decision)
	}
	over := desc("remote_address", "198.51.100.1")
	over.Limit = &sluice.Limit{Rate: 1, Period: time.Hour}
	e.CheckDescriptors(ctx, "edge", []Descriptor{over}, &res)
	if e.CheckDescriptors(ctx, "edge", []Descriptor{over}, &res); res.Allowed || res.Statuses[0].Limit.Rate != 1 {
		t.Fatalf("override of 1 per hour: %+v", res.Statuses[0].Decision)
	}
}

func TestShadowDescriptorsNeverReject(t *testing.T) {
	e := envoyEngine(t)
	var res Result
	d := desc("api_key", "k1", "path", "/export/x")
	for i := range 12 {
		e.CheckDescriptors(context.Background(), "edge", []Descriptor{d}, &res)
		if !res.Allowed || !res.Statuses[0].Shadow || res.Statuses[0].Allowed != (i < 10) {
			t.Fatalf("shadow request %d: %+v", i, res.Statuses[0])
		}
	}
}

// keyRecorder remembers the key of every take it is asked for.
type keyRecorder struct {
	sluice.Store
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	k.mu.Lock()
	for _, tk := range takes {
		k.keys = append(k.keys, tk.Key)
	}
	k.mu.Unlock()
	return k.Store.Take(ctx, takes, out)
}

// A descriptor's count is kept under a key made of its entries, each as
// its length, a colon, and key=value: a format the store keeps across
// restarts and upgrades, so a change to it would reset every count. It is
// pinned here.
func TestEnvoyStoreKeysKeepTheirFormat(t *testing.T) {
	cfg, err := rules.Load("../examples/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rec := &keyRecorder{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch)))}
	e, err := New(cfg, Options{Store: rec, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := e.CheckDescriptors(context.Background(), "edge", []Descriptor{desc("api_key", "k1", "path", "/items")}, &res); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10:api_key=k111:path=/items"}; !slices.Equal(rec.keys, want) {
		t.Fatalf("store keys %q, want %q", rec.keys, want)
	}
}

// envoyproxy/ratelimit's integration test in its stop-on-over mode: two
// descriptors, 20 a minute and 10 an hour, 15 requests. From the 11th the
// second is over, the first is not charged and reports the remaining it
// has (10), not what it would have after the request (9).
func TestAnUnchargedDescriptorReportsTheRemainingItHas(t *testing.T) {
	cfg, err := rules.Parse("rl.yaml", []byte("domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, Options{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch))), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		var res Result
		if err := e.CheckDescriptors(context.Background(), "another", []Descriptor{desc("key2", "v"), desc("key3", "v")}, &res); err != nil {
			t.Fatal(err)
		}
		want1, want2, over := int64(20-(i+1)), int64(10-(i+1)), i >= 10
		if over {
			want1, want2 = 10, 0
		}
		if a, b := res.Statuses[0], res.Statuses[1]; res.Allowed == over || !a.Allowed || a.Remaining != want1 || b.Allowed == over || b.Remaining != want2 {
			t.Fatalf("request %d: allowed %v; key2 %+v, key3 %+v; want key2 with %d left, key3 with %d", i+1, res.Allowed, a.Decision, b.Decision, want1, want2)
		}
	}
}

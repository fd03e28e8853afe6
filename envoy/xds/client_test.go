package xds

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-rl/sluice/internal/testkit/xdstest"
	"github.com/sluice-rl/sluice/rules"
)

// The type written out is go-control-plane's, and its message's.
func TestTypeURLIsTheRateLimitConfigs(t *testing.T) {
	msg := "type.googleapis.com/" + string((&rlsconf.RateLimitConfig{}).ProtoReflect().Descriptor().FullName())
	if TypeURL != resource.RateLimitConfigType || TypeURL != msg {
		t.Fatalf("TypeURL %q; go-control-plane's %q, the message's %q", TypeURL, resource.RateLimitConfigType, msg)
	}
}

type applied struct {
	cfg     *rules.Config
	version string
}

// run starts a client of s whose applied configurations arrive on the
// channel returned.
func run(t *testing.T, addr string, merge bool) (*Client, <-chan applied) {
	t.Helper()
	got := make(chan applied, 16)
	c := &Client{Server: addr, NodeID: "node-1", MergeDomains: merge,
		Backoff: Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond, RandomFactor: 0.5},
		Apply:   func(cfg *rules.Config, v string) { got <- applied{cfg, v} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c, got
}

func next(t *testing.T, got <-chan applied) applied {
	t.Helper()
	select {
	case a := <-got:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no configuration applied within 20 s")
		return applied{}
	}
}

func limitOf(t *testing.T, cfg *rules.Config, domain string) int64 {
	t.Helper()
	for _, r := range cfg.Rules {
		if r.Envoy != nil && r.Envoy.Domain == domain {
			return r.Limit.Rate
		}
	}
	t.Fatalf("no rule of domain %q in %d rules", domain, len(cfg.Rules))
	return 0
}

// waitFor polls until ok holds (20 s at most).
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within 20 s: %s", what)
		}
	}
}

func TestInitialConfigUpdateAndBadUpdate(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0")
	s.Set(t, "node-1", "v1", xdstest.Limit("a", "shop", "user", "", 2, rlsconf.RateLimitUnit_MINUTE))
	c, got := run(t, s.Addr, false)

	a := next(t, got)
	if a.version != "v1" || limitOf(t, a.cfg, "shop") != 2 || a.cfg.Rules[0].Limit.Period != time.Minute {
		t.Fatalf("first configuration: version %q, rules %+v", a.version, a.cfg.Rules[0].Limit)
	}
	// The ACK names the version applied and the response's nonce.
	waitFor(t, "an ACK of v1", func() bool {
		for _, r := range s.Requests() {
			if r.VersionInfo == "v1" && r.ResponseNonce != "" && r.ErrorDetail == nil {
				return true
			}
		}
		return false
	})

	s.Set(t, "node-1", "v2", xdstest.Limit("a", "shop", "user", "", 3, rlsconf.RateLimitUnit_HOUR))
	if a := next(t, got); a.version != "v2" || limitOf(t, a.cfg, "shop") != 3 || a.cfg.Rules[0].Limit.Period != time.Hour {
		t.Fatalf("update: version %q, limit %+v", a.version, a.cfg.Rules[0].Limit)
	}

	// A limit with no unit does not load: NACKed, nothing applied, v2 stays.
	s.Set(t, "node-1", "v3", xdstest.Limit("a", "shop", "user", "", 5, rlsconf.RateLimitUnit_UNKNOWN))
	waitFor(t, "a NACK of v3", func() bool {
		for _, r := range s.Requests() {
			if r.ErrorDetail != nil {
				if r.VersionInfo != "v2" || !strings.Contains(r.ErrorDetail.Message, "unit") {
					t.Fatalf("NACK names version %q (want v2, the one serving), fault %q", r.VersionInfo, r.ErrorDetail.Message)
				}
				return true
			}
		}
		return false
	})
	select {
	case a := <-got:
		t.Fatalf("a refused update was applied: version %q", a.version)
	default:
	}
	if v, _ := c.Version(); v != "v2" {
		t.Fatalf("version after a refused update: %q, want v2", v)
	}
	if ok, refused := c.Updates(); ok != 2 || refused != 1 {
		t.Fatalf("updates: %d applied, %d refused; want 2 and 1", ok, refused)
	}
	if !strings.Contains(c.LastFault(), "descriptors[0].rate_limit.unit") {
		t.Fatalf("the fault does not name the field: %q", c.LastFault())
	}

	// go-control-plane's cache sends v3 back on each NACK: the client NACKs
	// it again at most once a second, not in a tight loop.
	time.Sleep(1500 * time.Millisecond)
	nacks := 0
	for _, r := range s.Requests() {
		if r.ErrorDetail != nil {
			nacks++
		}
	}
	if nacks > 3 {
		t.Fatalf("%d NACKs of one version in 1.5 s: want at most 3", nacks)
	}

	// The next good one is taken.
	s.Set(t, "node-1", "v4", xdstest.Limit("a", "shop", "user", "", 7, rlsconf.RateLimitUnit_SECOND))
	if a := next(t, got); a.version != "v4" || limitOf(t, a.cfg, "shop") != 7 {
		t.Fatalf("after a NACK: version %q", a.version)
	}
}

func TestAServerRestartKeepsTheRulesAndReconnects(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0")
	addr := s.Addr
	s.Set(t, "node-1", "v1", xdstest.Limit("a", "shop", "user", "", 2, rlsconf.RateLimitUnit_MINUTE))
	c, got := run(t, addr, false)
	next(t, got)
	waitFor(t, "connected", c.Connected)

	s.Stop()
	waitFor(t, "the stream's end seen", func() bool { return !c.Connected() })
	select {
	case a := <-got:
		t.Fatalf("the server's end applied a configuration: %q with %d rules", a.version, len(a.cfg.Rules))
	case <-time.After(300 * time.Millisecond): // several backoffs
	}
	if v, _ := c.Version(); v != "v1" {
		t.Fatalf("version while the server is away: %q, want v1 kept", v)
	}

	// A new server on the same address, with a new state of the world.
	s2 := xdstest.Start(t, addr)
	s2.Set(t, "node-1", "v2", xdstest.Limit("a", "shop", "user", "", 9, rlsconf.RateLimitUnit_MINUTE))
	if a := next(t, got); a.version != "v2" || limitOf(t, a.cfg, "shop") != 9 {
		t.Fatalf("after the restart: version %q", a.version)
	}
	// The new stream's first request carried the version it had.
	if r := s2.Requests(); len(r) == 0 || r[0].VersionInfo != "v1" || r[0].Node.GetId() != "node-1" {
		t.Fatalf("first request to the new server: %v", r)
	}
}

func TestTwoDomainsAndOneDomainInTwoResources(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0")
	s.Set(t, "node-1", "v1",
		xdstest.Limit("a", "shop", "user", "", 2, rlsconf.RateLimitUnit_MINUTE),
		xdstest.Limit("b", "search", "ip", "", 4, rlsconf.RateLimitUnit_MINUTE))
	_, got := run(t, s.Addr, false)
	a := next(t, got)
	if limitOf(t, a.cfg, "shop") != 2 || limitOf(t, a.cfg, "search") != 4 || len(a.cfg.EnvoyDomains) != 2 {
		t.Fatalf("two domains: %v", a.cfg.EnvoyDomains)
	}

	// Two resources of one domain are refused, as two files are...
	s.Set(t, "node-1", "v2",
		xdstest.Limit("a", "shop", "user", "", 2, rlsconf.RateLimitUnit_MINUTE),
		xdstest.Limit("b", "shop", "ip", "", 4, rlsconf.RateLimitUnit_MINUTE))
	waitFor(t, "a NACK of one domain in two resources", func() bool {
		for _, r := range s.Requests() {
			if r.ErrorDetail != nil && strings.Contains(r.ErrorDetail.Message, `"shop" is also declared`) {
				return true
			}
		}
		return false
	})
	// ...and merged when the service is told to merge domains.
	s2 := xdstest.Start(t, "127.0.0.1:0")
	s2.Set(t, "node-1", "v2",
		xdstest.Limit("a", "shop", "user", "", 2, rlsconf.RateLimitUnit_MINUTE),
		xdstest.Limit("b", "shop", "ip", "", 4, rlsconf.RateLimitUnit_MINUTE))
	_, got2 := run(t, s2.Addr, true)
	if a := next(t, got2); len(a.cfg.Rules) != 2 || len(a.cfg.EnvoyDomains) != 1 {
		t.Fatalf("merged: %d rules, domains %v", len(a.cfg.Rules), a.cfg.EnvoyDomains)
	}
}

// Every field of a RateLimitConfig reaches the rule it makes.
func TestEveryFieldIsRead(t *testing.T) {
	meta := map[string]any{"team": "search"}
	rc := &rlsconf.RateLimitConfig{Name: "all", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", Value: "v", ShadowMode: true, DetailedMetric: true, QuotaMode: true,
			RateLimit:   &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_WEEK, RequestsPerUnit: 5, Name: "five"},
			Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "inner", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, Replaces: []*rlsconf.RateLimitReplace{{Name: "five"}}}}}},
		{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "white"},
	}}
	s, err := structOf(meta)
	if err != nil {
		t.Fatal(err)
	}
	rc.Descriptors[0].Metadata = s
	cfg, err := load(rc)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*rules.Rule{}
	for _, r := range cfg.Rules {
		byKey[r.Envoy.Entries[len(r.Envoy.Entries)-1].Key] = r
	}
	k, inner, free, white := byKey["k"], byKey["inner"], byKey["free"], byKey["white"]
	switch {
	case k == nil || inner == nil || free == nil || white == nil:
		t.Fatalf("rules: %v", byKey)
	case !k.Shadow || !k.Envoy.DetailedMetric || !k.Envoy.QuotaMode || k.Envoy.Name != "five" || k.Limit.Rate != 5 || k.Limit.Period != 7*24*time.Hour:
		t.Fatalf("k: %+v", k)
	case k.Envoy.Metadata["team"] != "search" || k.Envoy.Entries[0].Value != "v":
		t.Fatalf("k's metadata %v, entry %+v", k.Envoy.Metadata, k.Envoy.Entries[0])
	case !inner.Envoy.Deny || len(inner.Envoy.Replaces) != 1 || inner.Envoy.Replaces[0] != "five" || len(inner.Envoy.Entries) != 2:
		t.Fatalf("inner (0 per day, replacing five): %+v", inner)
	case !free.Envoy.Unlimited:
		t.Fatalf("free: %+v", free)
	case !white.Envoy.Whitelisted:
		t.Fatalf("white: %+v", white)
	}
}

func TestBackoffGrowsToItsMaxWithJitter(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 8 * time.Second, RandomFactor: 0.5}
	for attempt, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		lo, hi := want/2, want*3/2
		var seen [2]bool
		for range 200 {
			d := b.wait(attempt)
			if d < lo || d > hi {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, lo, hi)
			}
			seen[0] = seen[0] || d < want
			seen[1] = seen[1] || d > want
		}
		if !seen[0] || !seen[1] {
			t.Fatalf("attempt %d: no jitter either side of %v", attempt, want)
		}
	}
	if d := (Backoff{Initial: time.Second, Max: 4 * time.Second, NoJitter: true}).wait(10); d != 4*time.Second {
		t.Fatalf("without jitter, attempt 10: %v, want the max", d)
	}
	if d := (Backoff{}).wait(0); d < 5*time.Second || d > 15*time.Second {
		t.Fatalf("default first wait %v, want 10 s ± 50%%", d)
	}
}

func structOf(m map[string]any) (*structpb.Struct, error) { return structpb.NewStruct(m) }

// A resource nested thousands deep is refused at once (its YAML would grow
// in the square of its depth), and hundreds of bad resources make a NACK
// of bounded size (the management server must be able to read it: 20,000
// made one of 2.2 MB, and 40,000 would pass gRPC's 4 MiB).
func TestHostileResourcesAreNACKedCheaply(t *testing.T) {
	deep := &rlsconf.RateLimitDescriptor{Key: "leaf", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}}
	for i := range 9000 {
		deep = &rlsconf.RateLimitDescriptor{Key: fmt.Sprintf("k%d", i), Descriptors: []*rlsconf.RateLimitDescriptor{deep}}
	}
	_, err := load(&rlsconf.RateLimitConfig{Name: "deep", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{deep}})
	if err == nil || !strings.Contains(err.Error(), "nested deeper than 64") {
		t.Fatalf("9000 levels: %v", err)
	}
	s := xdstest.Start(t, "127.0.0.1:0")
	var bad []*rlsconf.RateLimitConfig
	for i := range 500 { // 500 faults of about 110 bytes each: past the 4 KiB cap
		bad = append(bad, xdstest.Limit(fmt.Sprint("r", i), fmt.Sprint("d", i), "k", "", 1, rlsconf.RateLimitUnit_UNKNOWN))
	}
	s.Set(t, "node-1", "bad", bad...)
	run(t, s.Addr, false)
	var nack string
	waitFor(t, "a NACK", func() bool {
		for _, r := range s.Requests() {
			if r.ErrorDetail != nil {
				nack = r.ErrorDetail.Message
				return true
			}
		}
		return false
	})
	if len(nack) > maxFaultText+100 || !strings.Contains(nack, "more faults") {
		t.Fatalf("NACK of 500 faults: %d bytes, %.100q...", len(nack), nack)
	}
}

// A snapshot costs what its file costs: reading a RateLimitConfig of 5,000
// descriptors allocates at most twice what loading the same rules from a
// file does (it was five times, written out as YAML: 50,000 descriptors
// took 1.2 GB where the file took 230 MB).
func TestASnapshotAllocatesAboutWhatItsFileDoes(t *testing.T) {
	const n = 5000
	rc := &rlsconf.RateLimitConfig{Name: "big", Domain: "d"}
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range n {
		rc.Descriptors = append(rc.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint("v", i),
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 10}})
		fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", i)
	}
	src := []byte(b.String())
	allocated := func(f func() error) uint64 {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		if err := f(); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&m1)
		return m1.TotalAlloc - m0.TotalAlloc
	}
	file := allocated(func() error { _, err := rules.Parse("f.yaml", src); return err })
	snapshot := allocated(func() error {
		cfg, err := load(rc)
		if err == nil && len(cfg.EnvoyDomains) != 1 {
			err = fmt.Errorf("domains %v", cfg.EnvoyDomains)
		}
		return err
	})
	t.Logf("%d descriptors: the file allocates %d KB, the snapshot %d KB (%.2fx)", n, file>>10, snapshot>>10, float64(snapshot)/float64(file))
	if snapshot > 2*file {
		t.Fatalf("the snapshot allocates %d KB, more than twice the file's %d KB", snapshot>>10, file>>10)
	}
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/storecall"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func mustRules(t testing.TB, src string) *rules.Config {
	t.Helper()
	c, err := rules.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// faultyStore wraps a store and fails or stalls on demand. A stalled call
// waits for its context, as a slow network call would.
type faultyStore struct {
	inner sluice.Store
	mode  atomic.Int32 // 0 ok, 1 fail, 2 stall, 3 stall then apply, 4 hold until released, 5 queue until released
	calls atomic.Int64
	// release, in mode 4, is closed by the test to let the held calls
	// through: applied and answered, after their deadline.
	release atomic.Pointer[chan struct{}]
	// before, if set, sees each call's takes before the store does: a
	// test's way to act while a call is in flight.
	before atomic.Pointer[func([]sluice.Take)]
}

// DropLimit passes on to the store, as a wrapper in front of one must.
func (s *faultyStore) DropLimit(rule string, l sluice.Limit) {
	if d, ok := s.inner.(LimitDropper); ok {
		d.DropLimit(rule, l)
	}
}

var errDown = errors.New("store down")

func (f *faultyStore) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	f.calls.Add(1)
	if b := f.before.Load(); b != nil {
		(*b)(takes)
	}
	switch mode := f.mode.Load(); mode {
	case 1:
		return errDown
	case 2:
		<-ctx.Done()
		return ctx.Err()
	case 3: // a hung store that applies the call when it wakes
		<-ctx.Done()
		f.inner.Take(context.Background(), takes, make([]sluice.Decision, len(takes)))
		return ctx.Err()
	case 4, 5: // a slow store: the call applies and answers once released
		select {
		case <-*f.release.Load():
		case <-ctx.Done():
			return ctx.Err()
		}
		if mode == 5 && sluice.PastSendBy(ctx) { // 5: a store that queued the call
			return sluice.ErrNotSent
		}
	}
	return f.inner.Take(ctx, takes, out)
}

type fixture struct {
	e        *Engine
	clock    *sluice.ManualClock
	store    *faultyStore
	mem      *memory.Store
	fallback sluice.Store
}

func newFixture(t testing.TB, src string, o Options) *fixture {
	t.Helper()
	clock := sluice.NewManualClock(epoch)
	mem := memory.New(memory.WithClock(clock))
	f := &fixture{clock: clock, store: &faultyStore{inner: mem}, mem: mem}
	o.Store = f.store
	if o.Calls.Timeout == 0 {
		// Generous: these tests are about rules, not deadlines, and a loaded
		// machine under -race must not make a call fail open.
		o.Calls.Timeout = time.Minute
	}
	if o.Fallback == nil {
		o.Fallback = memory.New(memory.WithClock(clock))
	}
	f.fallback = o.Fallback
	o.Logger = quiet
	e, err := New(mustRules(t, src), o)
	if err != nil {
		t.Fatal(err)
	}
	f.e = e
	return f
}

func (f *fixture) check(t testing.TB, req *rules.Request) *Result {
	t.Helper()
	var res Result
	if err := f.e.Check(context.Background(), req, CheckOptions{}, &res); err != nil {
		t.Fatal(err)
	}
	return &res
}

func userReq(user string) *rules.Request {
	return &rules.Request{Method: "GET", Path: "/items", ClientIP: netip.MustParseAddr("203.0.113.7"),
		Header: http.Header{"X-User-Id": {user}}}
}

// A rule file means what it says: per user and IP, 10 per 15 minutes
// ("login" has no match, so it counts every request); per user, 20
// at once then 100 per minute; otp-sms and tenant, which say
// onMissingKey: skip, skip requests without a phone or tenant.
func TestRulesMeanWhatTheySay(t *testing.T) {
	c, err := rules.Load("testdata/every-request.json")
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.WithClock(sluice.NewManualClock(epoch)))
	e, _ := New(c, Options{Store: mem, Logger: quiet})
	var res Result
	ctx := context.Background()
	for i := range 11 { // one user, one address
		e.Check(ctx, userReq("u42"), CheckOptions{}, &res)
		if want := i < 10; res.Allowed != want {
			t.Fatalf("request %d: allowed=%v, want %v (%+v)", i+1, res.Allowed, want, res.Decision)
		}
	}
	if res.Decision.Rule != "login" || res.Decision.RetryAfter != 90*time.Second || res.Skipped != 2 {
		t.Fatalf("11th: %+v (skipped %d), want login for 90s with otp-sms and tenant skipped", res.Decision, res.Skipped)
	}
	for i := range 11 { // the same user from other addresses: 20 in all, then user-default
		req := userReq("u42")
		req.ClientIP = netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 3)})
		e.Check(ctx, req, CheckOptions{}, &res)
		if want := i < 10; res.Allowed != want {
			t.Fatalf("request %d from another address: allowed=%v (%+v)", i+1, res.Allowed, res.Decision)
		}
	}
	if res.Decision.Rule != "user-default" || res.Decision.RetryAfter != 600*time.Millisecond {
		t.Fatalf("21st for the user: %+v, want user-default for 600ms", res.Decision)
	}
}

func TestADenialConsumesNothingFromTheOtherRules(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: loose, key: [user], rate: 100, per: 1h}
  - {id: tight, key: [user], rate: 2, per: 1h}
`, Options{})
	for range 2 {
		f.check(t, userReq("u"))
	}
	for range 5 {
		if res := f.check(t, userReq("u")); res.Allowed || res.Decision.Rule != "tight" {
			t.Fatalf("over the tight rule: %+v", res.Decision)
		}
	}
	lim, _ := f.mem.Limiter("loose", sluice.Limit{Rate: 100, Period: time.Hour})
	if d, _ := lim.Take("u", 0); d.Remaining != 98 {
		t.Fatalf("loose rule has %d left, want 98: denied requests consumed from it", d.Remaining)
	}
}

func TestShadowRulesReportButNeverReject(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: real, key: [user], rate: 100, per: 1h}
  - {id: trial, key: [user], rate: 3, per: 1h, mode: shadow}
`, Options{})
	var wouldBlock int
	for range 10 {
		res := f.check(t, userReq("u"))
		if !res.Allowed {
			t.Fatalf("a shadow rule rejected: %+v", res.Decision)
		}
		for _, st := range res.Statuses {
			if st.Shadow && !st.Allowed {
				wouldBlock++
			}
		}
	}
	if wouldBlock != 7 {
		t.Fatalf("shadow rule would have blocked %d, want 7", wouldBlock)
	}
	for _, s := range f.e.Stats() {
		if s.Rule == "trial" && (s.ShadowLimited != 7 || s.Allowed != 3) {
			t.Fatalf("shadow stats %+v", s)
		}
	}
}

// A rule counts a request as allowed only if the request passed: when
// another rule refuses it, the rule with room was overruled (and charged
// nothing).
func TestRuleStatsCountAllowedOnlyForAdmittedRequests(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: wide, key: [user], rate: 100, per: 1h}
  - {id: narrow, key: [user], rate: 3, per: 1h}
`, Options{})
	for range 10 {
		f.check(t, userReq("u"))
	}
	want := map[string]RuleStats{
		"wide":   {Rule: "wide", Allowed: 3, Overruled: 7},
		"narrow": {Rule: "narrow", Allowed: 3, Limited: 7},
	}
	for _, s := range f.e.Stats() {
		w := want[s.Rule]
		if s.Allowed != w.Allowed || s.Overruled != w.Overruled || s.Limited != w.Limited {
			t.Errorf("%s: allowed %d, overruled %d, limited %d; want %d, %d, %d", s.Rule, s.Allowed, s.Overruled, s.Limited, w.Allowed, w.Overruled, w.Limited)
		}
	}
	res := f.check(t, userReq("u"))
	if res.Allowed {
		t.Fatal("narrow let an 11th through")
	}
	for _, st := range res.Statuses {
		if st.Rule == "wide" && st.Remaining != 97 {
			t.Fatalf("wide: %d left, want 97: overruled requests were charged", st.Remaining)
		}
	}
}

func TestPenaltyLocksTheKeyAcrossEngines(t *testing.T) {
	src := `
rules:
  - {id: login, key: [user], rate: 2, per: 1m, penalty: {after: 3, block: 15m}}
`
	f := newFixture(t, src, Options{})
	other, _ := New(mustRules(t, src), Options{Store: f.store, Logger: quiet}) // a second gateway
	var res Result
	for i := range 5 { // 2 allowed, then 3 rejections: the third locks
		f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
		if want := i < 2; res.Allowed != want || (!want && res.Reason != sluice.ReasonLimited) {
			t.Fatalf("attempt %d: %+v", i+1, res.Decision)
		}
	}
	f.clock.Advance(2 * time.Minute) // the rate limit alone would admit again
	other.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	if res.Allowed || res.Reason != sluice.ReasonLocked || res.Decision.RetryAfter <= 12*time.Minute {
		t.Fatalf("after the penalty, on the other gateway: %+v, want locked for ~13 more minutes", res.Decision)
	}
	f.clock.Advance(14 * time.Minute)
	if f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res); !res.Allowed {
		t.Fatalf("after the lock expired: %+v", res.Decision)
	}
}

func TestCountOnChargesOnlyMatchingResponses(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: login, match: {method: POST, path: /login}, key: [user], rate: 3, per: 15m, algorithm: sliding-log, countOn: {status: [401, 403]}}
`, Options{})
	login := func() *Result {
		req := userReq("u")
		req.Method, req.Path = "POST", "/login"
		return f.check(t, req)
	}
	for range 10 { // successful logins never count
		res := login()
		if !res.Allowed {
			t.Fatalf("successful logins were counted: %+v", res.Decision)
		}
		f.e.Charge(context.Background(), res, 200)
	}
	for i := range 3 {
		res := login()
		if !res.Allowed {
			t.Fatalf("failed attempt %d rejected early: %+v", i+1, res.Decision)
		}
		f.e.Charge(context.Background(), res, 401)
	}
	res := login()
	if res.Allowed || res.Decision.Rule != "login" || res.Decision.RetryAfter != 15*time.Minute {
		t.Fatalf("after 3 failures: %+v, want rejected for 15m", res.Decision)
	}
}

func TestStoreFailuresFollowEachRulesFailMode(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: open, key: [user], rate: 100, per: 1h, fallback: {rate: 2, per: 1h}}
  - {id: otp, match: {path: /otp}, key: [user], rate: 3, per: 10m, failMode: closed}
`, Options{Calls: storecall.Options{BreakerFailures: 1000}})
	f.store.mode.Store(1)
	for i := range 3 {
		res := f.check(t, userReq("u"))
		if want := i < 2; res.Allowed != want || !res.Statuses[0].FailedOpen || res.StoreError == nil {
			t.Fatalf("fail-open request %d: allowed=%v %+v", i+1, res.Allowed, res.Statuses)
		}
	}
	otp := userReq("v")
	otp.Path = "/otp"
	res := f.check(t, otp)
	if res.Allowed || res.Reason != sluice.ReasonUnavailable || res.Decision.Rule != "otp" || res.Decision.RetryAfter <= 0 {
		t.Fatalf("fail-closed rule: %+v", res.Decision)
	}
}

func TestAStalledStoreIsCutOffByTheDeadline(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 5, per: 1m}\n", Options{Calls: storecall.Options{Timeout: 20 * time.Millisecond, BreakerFailures: 1000}})
	f.store.mode.Store(2)
	done := make(chan *Result)
	go func() { done <- f.check(t, userReq("u")) }()
	select {
	case res := <-done:
		if !res.Allowed || !errors.Is(res.StoreError, context.DeadlineExceeded) {
			t.Fatalf("stalled store: allowed=%v error=%v", res.Allowed, res.StoreError)
		}
	case <-time.After(30 * time.Second): // a hang, not a duration assertion
		t.Fatal("check hung on a stalled store")
	}
}

func TestBreakerOpensStopsCallingAndCloses(t *testing.T) {
	// Open for an hour: the assertions on the open breaker cannot race its
	// timer, however slow the machine.
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 5, per: 1m}\n", Options{Calls: storecall.Options{
		BreakerFailures: 3, BreakerOpenFor: time.Hour,
	}})
	f.store.mode.Store(1)
	for range 3 {
		f.check(t, userReq("u"))
	}
	if s := f.e.Store().BreakerState(); s != "open" {
		t.Fatalf("breaker %s after 3 failures, want open", s)
	}
	calls := f.store.calls.Load()
	res := f.check(t, userReq("u"))
	if f.store.calls.Load() != calls || !errors.Is(res.StoreError, storecall.ErrBreakerOpen) || !res.Allowed {
		t.Fatalf("open breaker still called the store (%d -> %d) or answered wrongly: %+v", calls, f.store.calls.Load(), res)
	}

	// Open for a millisecond: once the store is back, a probe closes it.
	var mu sync.Mutex
	var changes []string
	g := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 5, per: 1m}\n", Options{Calls: storecall.Options{
		BreakerFailures: 3, BreakerOpenFor: time.Millisecond,
		OnBreakerChange: func(from, to string) { mu.Lock(); changes = append(changes, from+"->"+to); mu.Unlock() },
	}})
	g.store.mode.Store(1)
	for range 3 {
		g.check(t, userReq("u"))
	}
	g.store.mode.Store(0) // the store is back
	deadline := time.Now().Add(10 * time.Second)
	for g.e.Store().BreakerState() != "closed" {
		if time.Now().After(deadline) {
			t.Fatalf("breaker never closed: %s", g.e.Store().BreakerState())
		}
		time.Sleep(2 * time.Millisecond)
		g.check(t, userReq("u"))
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(changes) != "[closed->open open->half-open half-open->closed]" {
		t.Fatalf("breaker changes %v", changes)
	}
}

// A request that lacks a source of a rule's key is counted under the
// rule's fallback key (the client address by default) in a key space of
// its own, refused with onMissingKey: reject, and counted by nothing only
// with onMissingKey: skip, written out.
func TestMissingKeysFallBackRejectOrSkipAsTheRuleSays(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: by-user, key: [user], rate: 3, per: 1m}
  - {id: by-tenant, key: [tenant], rate: 5, per: 1m, onMissingKey: reject}
  - {id: by-plan, key: [header:X-Plan], rate: 1, per: 1m, onMissingKey: skip}
  - {id: by-org, key: [header:X-Org], rate: 2, per: 1m, fallbackKey: [header:X-Device]}
`, Options{})
	req := userReq("u")
	res := f.check(t, req)
	if res.Allowed || res.Reason != sluice.ReasonMissingKey || res.Decision.Rule != "by-tenant" {
		t.Fatalf("missing tenant: %+v", res.Decision)
	}
	// No user: counted under the client address, 3 a minute; no plan:
	// skipped; no org: counted under the device, 2 a minute.
	anon := func(device string) *Result {
		return f.check(t, &rules.Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("203.0.113.9"),
			Header: http.Header{"X-Tenant-Id": {"t1"}, "X-Device": {device}}})
	}
	for i, want := range []string{"ok", "ok", "by-org"} {
		res := anon("d1")
		if got := map[bool]string{true: "ok", false: res.Decision.Rule}[res.Allowed]; got != want || res.Skipped != 1 {
			t.Fatalf("anonymous request %d on device d1: %s (skipped %d), want %s", i+1, got, res.Skipped, want)
		}
	}
	if res := anon("d2"); !res.Allowed {
		t.Fatalf("another device: refused by %s", res.Decision.Rule)
	}
	if res := anon("d3"); res.Allowed || res.Decision.Rule != "by-user" {
		t.Fatalf("the fourth request without a user from one address: %+v, want refused by by-user", res.Decision)
	}
	// A user named like a fallback key is not counted with the fallback:
	// client values starting with "~" are hashed.
	res = f.check(t, &rules.Request{Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("198.51.100.1"),
		Header: http.Header{"X-Tenant-Id": {"t1"}, "X-User-Id": {"~missing:203.0.113.9"}, "X-Org": {"o"}}})
	if !res.Allowed {
		t.Fatalf("a user named ~missing:203.0.113.9 shares the anonymous count of 203.0.113.9: %+v", res.Decision)
	}
	for _, st := range f.e.Stats() {
		if st.Rule == "by-user" && st.FellBack != 5 {
			t.Fatalf("by-user fell back %d times, want 5", st.FellBack)
		}
	}
}

func TestReloadKeepsUnchangedCountsAndRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - {id: a, key: [user], rate: 3, per: 1h}\n  - {id: b, key: [user], rate: 10, per: 1h}\n")
	c, _ := rules.Load(path)
	mem := memory.New(memory.WithClock(sluice.NewManualClock(epoch)))
	e, _ := New(c, Options{Store: mem, Logger: quiet})
	var res Result
	for range 3 {
		e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	}
	write("rules:\n  - {id: a, key: [user], rate: 3, per: 1h}\n  - {id: b, key: [user], rate: 20, per: 1h}\n")
	if err := e.ReloadFile(path); err != nil {
		t.Fatal(err)
	}
	e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	if res.Allowed || res.Decision.Rule != "a" {
		t.Fatalf("unchanged rule a lost its count: %+v", res.Decision)
	}
	sawB := false
	for _, st := range res.Statuses {
		if st.Rule == "b" {
			sawB = true
			// The 3 spent under 10/h stay spent under 20/h, and the
			// denial by a consumed nothing.
			if st.Remaining != 17 {
				t.Fatalf("changed rule b did not carry what its key spent: %+v", st.Decision)
			}
		}
	}
	if !sawB {
		t.Fatalf("rule b was not evaluated: %+v", res.Statuses)
	}
	write("rules:\n  - {id: a, key: [user], rate: 0, per: 1h}\n")
	if err := e.ReloadFile(path); err == nil {
		t.Fatal("invalid file accepted")
	}
	if got := len(e.Config().Rules); got != 2 {
		t.Fatalf("after a refused reload %d rules serve, want the old 2", got)
	}
	if ok, refused := e.Reloads(); ok != 1 || refused != 1 {
		t.Fatalf("reloads ok=%d refused=%d", ok, refused)
	}
}

// One change, seen by the file watcher and by a SIGHUP at once (two
// ReloadFile calls, racing), loads once: one reload counted, one log line.
// Unchanged files are not loaded again; a change after that is.
func TestOneChangeLoadsOnce(t *testing.T) {
	path, e := engineFromFile(t, "rules:\n  - {id: a, key: [user], rate: 3, per: 1h}\n")
	os.WriteFile(path, []byte("rules:\n  - {id: b, key: [user], rate: 3, per: 1h}\n"), 0o600)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if err := e.ReloadFile(path); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok, refused := e.Reloads(); ok != 1 || refused != 0 || e.Config().Rules[0].ID != "b" {
		t.Fatalf("one change: reloads ok=%d refused=%d, rule %s", ok, refused, e.Config().Rules[0].ID)
	}
	os.WriteFile(path, []byte("rules:\n  - {id: c, key: [user], rate: 0, per: 1h}\n"), 0o600)
	for range 2 {
		if err := e.ReloadFile(path); err == nil {
			t.Fatal("an invalid file was accepted")
		}
	}
	if ok, refused := e.Reloads(); ok != 1 || refused != 1 {
		t.Fatalf("one bad change: reloads ok=%d refused=%d, want it refused once", ok, refused)
	}
	os.WriteFile(path, []byte("rules:\n  - {id: d, key: [user], rate: 3, per: 1h}\n"), 0o600)
	if err := e.ReloadFile(path); err != nil || e.Config().Rules[0].ID != "d" {
		t.Fatalf("the fix: %v, rule %s", err, e.Config().Rules[0].ID)
	}
	if ok, _ := e.Reloads(); ok != 2 {
		t.Fatalf("reloads ok=%d after the fix, want 2", ok)
	}
}

func TestWatchFileReloadsOnChange(t *testing.T) {
	path, e := engineFromFile(t, "rules:\n  - {id: a, key: [user], rate: 3, per: 1h}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.WatchFile(ctx, 5*time.Millisecond, path)
	// The watcher may start after any given write: keep changing the file
	// until a change is picked up, assuming nothing about when it starts.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; e.Config().Rules[0].ID != "z"; i++ {
		if time.Now().After(deadline) {
			t.Fatal("file change not picked up in 10s")
		}
		os.WriteFile(path, []byte(fmt.Sprintf("rules:\n  - {id: z, key: [user], rate: %d, per: 1h}\n", 3+i)), 0o600)
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDryRunConsumesNothing(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 2, per: 1h}\n", Options{})
	var res Result
	for range 5 {
		f.e.Check(context.Background(), userReq("u"), CheckOptions{DryRun: true}, &res)
		if !res.Allowed || res.Decision.Remaining != 1 { // as if taken, yet nothing is
			t.Fatalf("dry run: %+v", res.Decision)
		}
	}
	f.e.Check(context.Background(), userReq("u"), CheckOptions{Cost: 3, DryRun: true}, &res)
	if res.Allowed {
		t.Fatal("dry run of cost 3 on a burst of 2 allowed")
	}
}

// Concurrent checks on the embedded store (which needs no deadline: a slow,
// loaded machine cannot make a call fail open) admit exactly the limit.
func TestConcurrentChecksAreExact(t *testing.T) {
	cfg := mustRules(t, "rules:\n  - {id: r, key: [user], rate: 50, per: 1h}\n  - {id: s, key: [user], rate: 80, per: 1h, algorithm: sliding-window}\n")
	e, err := New(cfg, Options{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch))), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			var res Result
			for range 20 {
				e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
				if res.Allowed {
					admitted.Add(1)
				}
				if res.StoreError != nil {
					t.Error(res.StoreError)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 50 {
		t.Fatalf("%d admitted, want exactly 50", admitted.Load())
	}
}

// BenchmarkFiveRules evaluates a request against five matching rules on the
// embedded store, which needs no deadline or breaker.
func BenchmarkFiveRules(b *testing.B) {
	clock := sluice.NewManualClock(epoch)
	c := mustRules(b, `
rules:
  - {id: ip, key: [ip], rate: 1000000, per: 1s}
  - {id: user, key: [user], rate: 1000000, per: 1s, burst: 1000}
  - {id: route, key: [user, route], match: {path: "/items"}, rate: 1000000, per: 1s}
  - {id: tenant, key: [tenant], rate: 1000000, per: 1s, algorithm: token-bucket}
  - {id: window, key: [user], rate: 1000000, per: 1s, algorithm: sliding-window}
`)
	e, err := New(c, Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	req := userReq("u42")
	req.Header["X-Tenant-Id"] = []string{"t1"}
	var res Result
	ctx := context.Background()
	for b.Loop() {
		clock.Advance(time.Microsecond)
		e.Check(ctx, req, CheckOptions{}, &res)
	}
	if len(res.Statuses) != 5 || !res.Allowed {
		b.Fatalf("statuses %d, allowed %v", len(res.Statuses), res.Allowed)
	}
}

func TestSIGHUPReloadsAndABadFileKeepsTheOldRules(t *testing.T) {
	path, e := engineFromFile(t, "rules:\n  - {id: a, key: [user], rate: 3, per: 1h}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Catch SIGHUP for the whole test, so that a signal sent before the
	// engine listens cannot take the default action and end the process.
	guard := make(chan os.Signal, 16)
	signal.Notify(guard, syscall.SIGHUP)
	defer signal.Stop(guard)
	go e.ReloadOnSignal(ctx, []string{path})
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
			syscall.Kill(os.Getpid(), syscall.SIGHUP)
			time.Sleep(20 * time.Millisecond)
		}
	}
	os.WriteFile(path, []byte("rules:\n  - {id: b, key: [user], rate: 3, per: 1h}\n"), 0o600)
	waitFor("reload on SIGHUP", func() bool { return e.Config().Rules[0].ID == "b" })
	os.WriteFile(path, []byte("rules:\n  - {id: c, key: [user], rate: -3, per: 1h}\n"), 0o600)
	waitFor("refusal on SIGHUP", func() bool { _, refused := e.Reloads(); return refused > 0 })
	if id := e.Config().Rules[0].ID; id != "b" {
		t.Fatalf("after a refused reload rule %q serves, want b", id)
	}
}

// The signals named are the ones that reload, SIGHUP is then not.
func TestReloadOnTheSignalsNamed(t *testing.T) {
	path, e := engineFromFile(t, "rules:\n  - {id: a, key: [user], rate: 3, per: 1h}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	guard := make(chan os.Signal, 16) // as above: no default action, ever
	signal.Notify(guard, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(guard)
	go e.ReloadOnSignal(ctx, []string{path}, syscall.SIGUSR1)
	os.WriteFile(path, []byte("rules:\n  - {id: b, key: [user], rate: 3, per: 1h}\n"), 0o600)
	for range 10 {
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
		time.Sleep(5 * time.Millisecond)
	}
	if id := e.Config().Rules[0].ID; id != "a" {
		t.Fatalf("SIGHUP reloaded (rule %q) though only SIGUSR1 was named", id)
	}
	for deadline := time.Now().Add(10 * time.Second); e.Config().Rules[0].ID != "b"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("SIGUSR1 did not reload within 10 s")
		}
		syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	}
}

func TestRefundGivesBackWhatACheckTook(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 2, per: 1h}\n  - {id: q, key: [user], rate: 10, per: 1s, burst: 3, algorithm: leaky-queue}\n", Options{})
	var res Result
	for range 2 {
		f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
		f.e.Refund(context.Background(), &res)
		f.e.Refund(context.Background(), &res) // a second call gives nothing more
	}
	f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	if !res.Allowed || res.Statuses[0].Remaining != 1 {
		t.Fatalf("after two refunded checks: %+v", res.Statuses)
	}
}

func TestInspectAndResetAKey(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, key: [user], rate: 2, per: 1h, penalty: {after: 1, block: 1h}}\n", Options{})
	for range 3 {
		f.check(t, userReq("u42"))
	}
	d, locked, err := f.e.Inspect(context.Background(), "login", "u42")
	if err != nil || d.Remaining != 0 || locked != time.Hour {
		t.Fatalf("inspect: %+v locked for %v, want 1h; %v", d, locked, err)
	}
	if _, err := f.e.Reset("login", "u42"); err == nil {
		t.Fatal("the faulty wrapper cannot forget, yet Reset succeeded")
	}
	e, _ := New(f.e.Config(), Options{Store: f.mem, Fallback: f.fallback, Logger: quiet})
	if found, err := e.Reset("login", "u42"); err != nil || !found {
		t.Fatalf("reset: %v %v", found, err)
	}
	if res := f.check(t, userReq("u42")); !res.Allowed {
		t.Fatalf("after a reset: %+v", res.Decision)
	}
	if _, _, err := f.e.Inspect(context.Background(), "nope", "u42"); !errors.Is(err, ErrNoRule) {
		t.Fatalf("unknown rule: %v", err)
	}
}

func TestChargeStatusChargesMatchingCountOnRules(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 2, per: 1h, countOn: {status: [401]}}\n  - {id: other, key: [user], rate: 2, per: 1h}\n", Options{})
	req := userReq("u")
	req.Path = "/login"
	var res Result
	for range 3 {
		if err := f.e.ChargeStatus(context.Background(), req, CheckOptions{}, 200, &res); err != nil || len(res.Statuses) != 0 {
			t.Fatalf("a 200 charged %+v (%v)", res.Statuses, err)
		}
	}
	for range 2 {
		f.e.ChargeStatus(context.Background(), req, CheckOptions{}, 401, &res)
		if len(res.Statuses) != 1 || res.Statuses[0].Rule != "login" {
			t.Fatalf("a 401 charged %+v", res.Statuses)
		}
	}
	if got := f.check(t, req); got.Allowed || got.Decision.Rule != "login" {
		t.Fatalf("after two charged failures: %+v", got.Decision)
	}
	// The other rule was never charged by ChargeStatus.
	lim, _ := f.mem.Limiter("other", sluice.Limit{Rate: 2, Period: time.Hour})
	if d, _ := lim.Take("u", 0); d.Remaining != 2 {
		t.Fatalf("other rule charged: %+v", d)
	}
}

// A countOn charge counts what happened, as an Envoy usage report does: a
// charge on a full count, or above the burst, is not refused and dropped
// but leaves the key in debt, which later checks wait out.
func TestACountOnChargeBeyondTheLimitIsADebt(t *testing.T) {
	const file = "rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 3, per: 1h, countOn: {status: [401]}}\n"
	interval := 20 * time.Minute // 3 an hour
	for _, tc := range []struct {
		name    string
		charges []int64 // the costs of the charged failures, in order
		owed    int64   // units beyond the limit after them
	}{
		{"five failures on a limit of 3", []int64{1, 1, 1, 1, 1}, 2},
		{"one charge of 4 above a burst of 3", []int64{4}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, file, Options{})
			req := userReq("u")
			req.Path = "/login"
			var res Result
			for _, c := range tc.charges {
				if err := f.e.ChargeStatus(context.Background(), req, CheckOptions{Cost: c}, 401, &res); err != nil {
					t.Fatal(err)
				}
				if len(res.Statuses) != 1 || !res.Statuses[0].Allowed {
					t.Fatalf("charge of %d: %+v, want it charged", c, res.Statuses)
				}
			}
			got := f.check(t, req)
			if got.Allowed {
				t.Fatalf("checked after the charges: admitted %+v", got.Decision)
			}
			// The next request needs one unit: the debt and that unit refill
			// first, one every 20 minutes.
			want := time.Duration(tc.owed+1) * interval
			if d := got.Decision.RetryAfter; d < want-time.Second || d > want {
				t.Fatalf("retry after %v, want %v: %d units owed and one to take", d, want, tc.owed)
			}
		})
	}
}

// engineFromFile writes a rule file and serves it on the embedded store.
func engineFromFile(t *testing.T, src string) (string, *Engine) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(c, Options{Store: memory.New(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return path, e
}

// A rule with several windows (10 per second and 15 per minute) admits a
// request only if every window has room, charges none of them when one
// refuses, and names the window that refused.
func TestSeveralWindowsOfOneRuleAreAllOrNothing(t *testing.T) {
	f := newFixture(t, `
rules:
  - {id: api, key: [user], rate: 10, per: 1s, algorithm: fixed-window, also: [{rate: 15, per: 1m}]}
`, Options{})
	var res Result
	admitted := 0
	for range 12 {
		f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 10 || res.Decision.Rule != "api" {
		t.Fatalf("first second: %d admitted, last refused by %q; want 10 and api", admitted, res.Decision.Rule)
	}
	f.clock.Advance(time.Second)
	admitted = 0
	for range 12 {
		f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 5 || res.Decision.Rule != "api.1m" {
		t.Fatalf("second second: %d admitted, last refused by %q; want 5 (15 a minute) and api.1m", admitted, res.Decision.Rule)
	}
	for _, st := range res.Statuses {
		if st.Rule == "api" && st.Remaining != 5 {
			t.Fatalf("the per-second window was charged for refused requests: %d left, want 5", st.Remaining)
		}
	}
}

// Plans: a rule may match a key source's value (X-Plan: gold gets its own
// limit), and exempt values skip a rule and count nothing: here the gold
// plan is exempt from the default limit, the office network and the
// monitoring user from every limit.
func TestPlansAndExemptions(t *testing.T) {
	f := newFixture(t, `
keys:
  plan: {header: X-Plan}
rules:
  - {id: default, key: [user], rate: 2, per: 1h, exempt: {plan: [gold], ip: [10.0.0.0/8], user: [monitor]}}
  - {id: gold, match: {values: {plan: [gold, platinum]}}, key: [user], rate: 5, per: 1h, exempt: {ip: [10.0.0.0/8]}}
`, Options{})
	admitted := func(user, plan, ip string, n int) (int, string) {
		got, last := 0, ""
		for range n {
			req := userReq(user)
			req.ClientIP = netip.MustParseAddr(ip)
			if plan != "" {
				req.Header.Set("X-Plan", plan)
			}
			res := f.check(t, req)
			if res.Allowed {
				got++
			}
			last = res.Decision.Rule
		}
		return got, last
	}
	for _, tc := range []struct {
		user, plan, ip string
		want           int
		rule           string
	}{
		{"free", "", "203.0.113.7", 2, "default"},
		{"payer", "gold", "203.0.113.7", 5, "gold"},
		{"other", "platinum", "203.0.113.7", 2, "default"}, // platinum is not exempt from default
		{"staff", "gold", "10.1.2.3", 20, ""},              // the office network: no rule applies
		{"monitor", "", "198.51.100.1", 20, ""},            // the monitoring user
	} {
		if got, rule := admitted(tc.user, tc.plan, tc.ip, 20); got != tc.want || rule != tc.rule {
			t.Errorf("%s (plan %q, %s): %d of 20 admitted, last by %q; want %d by %q", tc.user, tc.plan, tc.ip, got, rule, tc.want, tc.rule)
		}
	}
}

// A per-key override gives some keys another limit within one rule: the
// partner's API key gets 10x, every other key the rule's limit.
func TestPerKeyOverrides(t *testing.T) {
	f := newFixture(t, `
rules:
  - id: per-user
    key: [user]
    rate: 3
    per: 1h
    overrides: [{values: {user: [partner]}, rate: 30}]
`, Options{})
	for user, want := range map[string]int{"someone": 3, "partner": 30} {
		got, rule := 0, ""
		for range 40 {
			res := f.check(t, userReq(user))
			if res.Allowed {
				got++
			}
			rule = res.Decision.Rule
		}
		if got != want {
			t.Errorf("%s: %d of 40 admitted, want %d (last by %s)", user, got, want, rule)
		}
	}
	if ids := fmt.Sprint(len(f.e.Config().Rules), " ", f.e.Config().Rules[1].ID); ids != "2 per-user.key-limit-1" {
		t.Errorf("rules %s", ids)
	}
}

// Between rules that answer alike, the first in the file decides: the
// answer (its RateLimit fields, its rule) is the same from one request to
// the next. Among those that admit, the least remaining decides; among
// those that refuse, a cost that can never pass, then the longest wait.
func TestTiesAreDecidedByTheFirstRule(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: a, key: [user], rate: 2, per: 1m}\n  - {id: b, key: [user], rate: 2, per: 1m}\n", Options{})
	for i, want := range []struct {
		allowed bool
		rule    string
	}{{true, "a"}, {true, "a"}, {false, "a"}} {
		if res := f.check(t, userReq("u")); res.Allowed != want.allowed || res.Decision.Rule != want.rule {
			t.Fatalf("check %d: allowed %v by %q, want %v by %q (a tie)", i+1, res.Allowed, res.Decision.Rule, want.allowed, want.rule)
		}
	}
}

// The pressure factor is read once per check and applies only within
// (0, 1): 0 (or a broken reading) and 1 leave limits whole. A cost
// inflated past int64 is the largest, never a wrapped negative one.
func TestPressureFactorAndInflationEdges(t *testing.T) {
	for _, tc := range []struct{ pressure, want float64 }{{0, 1}, {-1, 1}, {1, 1}, {0.5, 0.5}, {2, 1}} {
		var res Result
		if got := res.factorOf(func() float64 { return tc.pressure }); got != tc.want {
			t.Errorf("pressure %v: factor %v, want %v", tc.pressure, got, tc.want)
		}
	}
	const big = int64(1) << 56 // x AdaptiveScale (64) = 2^62; / 0.5 = 2^63, one past MaxInt64
	if got := inflate(big, 0.5); got != math.MaxInt64 {
		t.Fatalf("inflate(2^56, 0.5) = %d, want MaxInt64", got)
	}
	if got := inflate(3, 0.5); got != 3*64*2 {
		t.Fatalf("inflate(3, 0.5) = %d, want %d", got, 3*64*2)
	}
}

// delayAfter lets the first requests beyond the rate through at once, as
// nginx's limit_req delay= does: burst 5 at 10/s admits six at one instant,
// delayed 0, 100, ..., 500 ms without it; with delayAfter: 3 each delay is
// 300 ms shorter, never below 0, and what is admitted is the same.
func TestDelayAfterShortensALeakyQueuesDelays(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want []time.Duration
	}{
		{"rules:\n  - {id: q, key: [user], rate: 10, per: 1s, burst: 5, algorithm: leaky-queue}\n", []time.Duration{0, 100, 200, 300, 400, 500}},
		{"rules:\n  - {id: q, key: [user], rate: 10, per: 1s, burst: 5, algorithm: leaky-queue, delayAfter: 3}\n", []time.Duration{0, 0, 0, 0, 100, 200}},
	} {
		f := newFixture(t, tc.src, Options{})
		for i, want := range tc.want {
			res := f.check(t, userReq("u"))
			if !res.Allowed || res.Delay != want*time.Millisecond || res.Statuses[0].Delay != res.Delay {
				t.Fatalf("%s request %d: allowed %v, delay %v, want %v", tc.src, i+1, res.Allowed, res.Delay, want*time.Millisecond)
			}
		}
		if res := f.check(t, userReq("u")); res.Allowed {
			t.Fatalf("%s: a seventh request at the same instant was admitted", tc.src)
		}
	}
	if _, err := rules.Parse("f.yaml", []byte("rules:\n  - {id: g, key: [user], rate: 10, per: 1s, delayAfter: 3}\n")); err == nil || !strings.Contains(err.Error(), "rules[0].delayAfter: applies to leaky-queue rules") {
		t.Fatalf("delayAfter on a gcra rule: %v", err)
	}
}

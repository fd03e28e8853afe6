package engine

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// A request cost times a rule's cost used to wrap: 2^62 x 3 is 2^62 mod
// 2^64, a take that admitted and reset the key. The product saturates, so
// the take is refused as more than the burst, every time.
func TestHugeCostIsRefusedNeverWrapped(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 100, per: 1h, cost: 3}\n", Options{})
	ctx := context.Background()
	for _, cost := range []int64{1 << 62, 4611686018427387904, math.MaxInt64, 1 << 61, math.MaxInt64/3 + 1} {
		var res Result
		if err := f.e.Check(ctx, userReq("u"), CheckOptions{Cost: cost}, &res); err != nil {
			t.Fatal(err)
		}
		if res.Allowed || res.Reason != sluice.ReasonTooLarge {
			t.Fatalf("cost %d x 3: allowed=%v reason=%v, want cost-exceeds-limit", cost, res.Allowed, res.Reason)
		}
	}
	// The key was never reset: 33 x 3 = 99 units still fit, the 34th not.
	for i := range 34 {
		res := f.check(t, userReq("u"))
		if res.Allowed != (i < 33) {
			t.Fatalf("request %d: allowed=%v", i+1, res.Allowed)
		}
	}
	var res Result
	if err := f.e.Check(ctx, userReq("u"), CheckOptions{Cost: -1}, &res); err == nil {
		t.Fatal("a negative cost was accepted")
	}
	if err := f.e.ChargeStatus(ctx, userReq("u"), CheckOptions{Cost: -1}, 200, &res); err == nil {
		t.Fatal("a negative cost was accepted by ChargeStatus")
	}
}

// A client that hangs up, or a gRPC call with a tiny deadline, is not a
// store failure: 40 of them must not open the breaker, and a fail-closed
// rule keeps admitting everyone else.
func TestClientCancellationsNeverOpenTheBreaker(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: otp, key: [user], rate: 1000, per: 1h, failMode: closed}\n", Options{Calls: storecall.Options{BreakerFailures: 5}})
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	tiny, cancel2 := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel2()
	<-tiny.Done()
	for i := range 40 {
		ctx := gone
		if i%2 == 1 {
			ctx = tiny
		}
		var res Result
		f.e.Check(ctx, userReq("u"), CheckOptions{}, &res)
		if !res.Allowed || res.StoreError != nil {
			t.Fatalf("call %d with a client context that is done: allowed=%v store error=%v", i, res.Allowed, res.StoreError)
		}
	}
	if s := f.e.Store().BreakerState(); s != "closed" {
		t.Fatalf("breaker %s after 40 client cancellations", s)
	}
	if res := f.check(t, userReq("other")); !res.Allowed {
		t.Fatalf("fail-closed rule rejects: %+v", res.Decision)
	}
	// The cancelled calls were accounted: 40 units of u are gone.
	if d, _, _ := f.e.Inspect(context.Background(), "otp", "u"); d.Remaining != 1000-40 {
		t.Fatalf("remaining %d, want %d", d.Remaining, 1000-40)
	}
}

// A penalty lock holds while the store fails (the breaker may be open), and
// one placed while the store failed holds when it is back.
func TestPenaltyLocksHoldWhileTheStoreFails(t *testing.T) {
	src := "rules:\n  - {id: login, key: [user], rate: 1, per: 1h, penalty: {after: 1, block: 1h}, fallback: {rate: 1000, per: 1h}}\n"
	f := newFixture(t, src, Options{Calls: storecall.Options{BreakerFailures: 1, BreakerOpenFor: time.Millisecond}})
	f.check(t, userReq("locked"))
	if res := f.check(t, userReq("locked")); res.Allowed {
		t.Fatal("second login admitted")
	}
	f.store.mode.Store(1) // the store fails; the breaker opens
	for i := range 3 {
		if res := f.check(t, userReq("locked")); res.Allowed || res.Reason != sluice.ReasonLocked {
			t.Fatalf("store down, check %d: allowed=%v reason=%v, want locked", i, res.Allowed, res.Reason)
		}
	}
	// While down, another key is counted and locked in the fallback...
	f.check(t, userReq("later"))
	for range 1000 {
		if res := f.check(t, userReq("later")); !res.Allowed {
			break
		}
	}
	res := f.check(t, userReq("later"))
	if res.Allowed {
		t.Fatal("fallback limit of 1000 not applied")
	}
	// ...and stays locked once the store is back (its breaker closed again,
	// so the store is asked), though the store never saw its rejections.
	f.store.mode.Store(0)
	f.waitBreakerClosed(t)
	for range 3 {
		if res := f.check(t, userReq("later")); res.Allowed || res.Reason != sluice.ReasonLocked {
			t.Fatalf("store back: allowed=%v reason=%v, want locked", res.Allowed, res.Reason)
		}
	}
}

// Keys are compared as the bytes sent: no two values share a count, long
// values are stored by a digest, and a value shaped like a digest cannot
// reach the digest of another.
func TestKeysAreBytesExactly(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 1, per: 1h}\n", Options{})
	long := strings.Repeat("x", MaxKeyBytes)
	values := []string{"\xff", "\xfe", "\ufffd", "a\x00", "a", long + "1", long + "2", long,
		hashedKeyPrefix + "00", StoreKey(long + "1"), "U", "u"}
	for _, v := range values {
		if res := f.check(t, userReq(v)); !res.Allowed {
			t.Fatalf("%q shares a count with an earlier value", v)
		}
	}
	for _, v := range values {
		if res := f.check(t, userReq(v)); res.Allowed {
			t.Fatalf("%q not counted", v)
		}
	}
	if k := StoreKey(long + "1"); len(k) > MaxKeyBytes || !strings.HasPrefix(k, hashedKeyPrefix) {
		t.Fatalf("long key stored as %q", k)
	}
	if StoreKey("u42") != "u42" {
		t.Fatal("a short key was changed")
	}
}

// Paths are matched as the upstream will read them: none of these escape a
// rule on POST /otp.
func TestPathTricksDoNotEscapeARule(t *testing.T) {
	for _, tc := range []struct {
		paths string
		path  string
	}{
		{"", "/otp"}, {"", "//otp"}, {"", "/otp/"}, {"", "/./otp"}, {"", "/%6Ftp"}, {"", "/%6ftp"},
		{"", "/x/../otp"}, {"", "/../otp"}, {"", "///otp//"}, {"", "/o%74p"}, {"", "/%2E/otp"},
		{"", "/OTP"}, {"", "/%4FTP"}, {"", "/Otp/"}, {"paths: {caseInsensitive: true}\n", "/OTP"},
	} {
		f := newFixture(t, tc.paths+"rules:\n  - {id: otp, match: {method: POST, path: /otp}, key: [user], rate: 1, per: 1h}\n", Options{})
		req := func(p string) *rules.Request {
			r := userReq("u")
			r.Method, r.Path = "POST", p
			return r
		}
		f.check(t, req("/otp"))
		if res := f.check(t, req(tc.path)); res.Allowed {
			t.Errorf("%s%q escaped the rule on /otp", tc.paths, tc.path)
		}
	}
	// Another path is another path, and with caseInsensitive: false so is
	// another case.
	f := newFixture(t, "paths: {caseInsensitive: false}\nrules:\n  - {id: otp, match: {path: /otp}, key: [user], rate: 1, per: 1h}\n", Options{})
	for _, p := range []string{"/otp%3B", "/OTP", "/otpx"} {
		r := userReq("u")
		r.Path = p
		var res Result
		f.e.Check(context.Background(), r, CheckOptions{}, &res)
		if len(res.Statuses) != 0 {
			t.Errorf("%q matched /otp", p)
		}
	}
	// trailingSlash: keep makes /otp/ a path of its own.
	f = newFixture(t, "paths: {trailingSlash: keep}\nrules:\n  - {id: otp, match: {path: /otp}, key: [user], rate: 1, per: 1h}\n", Options{})
	r := userReq("u")
	r.Path = "/otp/"
	var res Result
	f.e.Check(context.Background(), r, CheckOptions{}, &res)
	if len(res.Statuses) != 0 {
		t.Error("/otp/ matched /otp with trailingSlash: keep")
	}
}

// Descriptor limits come with the request: distinct ones must not grow
// the store's tables without end. Past the bound, the configured rule
// answers, and idle overrides make room.
func TestDistinctDescriptorLimitsAreBounded(t *testing.T) {
	src := "rules:\n  - {id: tenant, key: [tenant], rate: 5, per: 1h, envoy: {domain: edge, descriptors: [{key: tenant}]}}\n"
	f := newFixture(t, src, Options{MaxDescriptorLimits: 8})
	ctx := context.Background()
	desc := func(rate int64) []Descriptor {
		l := sluice.Limit{Rate: rate, Period: time.Second, Algorithm: sluice.FixedWindow}
		return []Descriptor{{Entries: []rules.EnvoyEntry{{Key: "tenant", Value: "t"}}, Hits: 1, Limit: &l}}
	}
	var res Result
	for rate := int64(1); rate <= 1000; rate++ {
		if err := f.e.CheckDescriptors(ctx, "edge", desc(rate), &res); err != nil {
			t.Fatal(err)
		}
	}
	live, refused := f.e.DescriptorLimitStats()
	if live != 8 || refused != 1000-8 {
		t.Fatalf("live %d refused %d, want 8 and %d", live, refused, 1000-8)
	}
	if tables := len(f.mem.Stats()); tables > 8+1 {
		t.Fatalf("%d tables in the store for 1,000 distinct overrides", tables)
	}
	// Refused overrides were answered by the configured rule: 5 per hour.
	if res.Statuses[0].Limit.Rate != 5 {
		t.Fatalf("over the bound, answered with %v", res.Statuses[0].Limit)
	}
	// Once the overrides are idle for their period, new ones get room.
	time.Sleep(10 * time.Millisecond)
	f.e.descLimits.start = f.e.descLimits.start.Add(-time.Hour) // as if an hour passed
	if err := f.e.CheckDescriptors(ctx, "edge", desc(5000), &res); err != nil {
		t.Fatal(err)
	}
	if res.Statuses[0].Limit.Rate != 5000 {
		t.Fatalf("an idle bound did not make room: answered with %v", res.Statuses[0].Limit)
	}
}

// A lock placed in the fallback store while the store failed holds when the
// store is back, however many penalty rules the request matches (the
// lookup once held at most 8).
func TestLocksPlacedWhileTheStoreFailedHoldForEveryPenaltyRule(t *testing.T) {
	for _, n := range []int{1, 8, 9, 20} {
		var src strings.Builder
		src.WriteString("rules:\n")
		for i := range n {
			fmt.Fprintf(&src, "  - {id: r%d, key: [user], rate: 100, per: 1h, penalty: {after: 1, block: 1h}, fallback: {rate: 2, per: 1h}}\n", i)
		}
		f := newFixture(t, src.String(), Options{Calls: storecall.Options{BreakerFailures: 1, BreakerOpenFor: time.Millisecond}})
		f.store.mode.Store(1) // the store fails: the fallback counts, and locks
		for range 3 {
			f.check(t, userReq("u"))
		}
		if res := f.check(t, userReq("u")); res.Allowed || res.Reason != sluice.ReasonLocked {
			t.Fatalf("%d penalty rules, store down: allowed=%v reason=%v, want locked", n, res.Allowed, res.Reason)
		}
		f.store.mode.Store(0)
		f.waitBreakerClosed(t)
		if res := f.check(t, userReq("u")); res.Allowed || res.Reason != sluice.ReasonLocked {
			t.Fatalf("%d penalty rules, store back: allowed=%v reason=%v, want locked (the store never saw the lock)", n, res.Allowed, res.Reason)
		}
	}
}

// A method in another case is counted as the method: a server that reads
// "post" as POST must not let it escape a rule on POST.
func TestMethodCaseDoesNotEscapeARule(t *testing.T) {
	f := newFixture(t, "rules:\n  - {id: otp, match: {method: POST, path: /otp}, key: [user], rate: 1, per: 1h}\n", Options{})
	for i, m := range []string{"POST", "post", "Post", "pOST"} {
		r := userReq("u")
		r.Method, r.Path = m, "/otp"
		res := f.check(t, r)
		if len(res.Statuses) != 1 || res.Allowed != (i == 0) {
			t.Fatalf("method %q: %d rules matched, allowed %v; want the rule on POST, and only the first admitted", m, len(res.Statuses), res.Allowed)
		}
	}
	if got := upperMethod("GET"); got != "GET" {
		t.Fatalf("upperMethod(GET) = %q", got)
	}
}

// A request without the rule's key is counted under its fallback key, bounded
// as every key is: up to MaxKeyBytes as it is, longer by its digest.
func TestAFallbackKeyIsBoundedAtMaxKeyBytes(t *testing.T) {
	// by-ip comes first: the key is bounded from where it starts in the
	// request's key buffer.
	f := newFixture(t, "rules:\n  - {id: by-ip, key: [ip], rate: 100, per: 1m}\n  - {id: by-org, key: [header:X-Org], rate: 2, per: 1m, fallbackKey: [header:X-Device]}\n", Options{})
	var mu sync.Mutex
	var keys []string
	see := func(takes []sluice.Take) {
		mu.Lock()
		defer mu.Unlock()
		for _, tk := range takes {
			keys = append(keys, tk.Key)
		}
	}
	f.store.before.Store(&see)
	fit := strings.Repeat("d", MaxKeyBytes-len(missingKeyPrefix))
	for _, device := range []string{fit, fit + "d"} {
		keys = nil
		r := userReq("u")
		r.Header.Set("X-Device", device)
		f.check(t, r)
		want := missingKeyPrefix + device
		if len(want) > MaxKeyBytes {
			want = StoreKey(want)
		}
		if len(keys) != 2 || keys[1] != want {
			t.Fatalf("a fallback key of %d bytes stored as %.30q, want %.30q", len(missingKeyPrefix)+len(device), keys, want)
		}
	}
}

// waitBreakerClosed sends probe checks until the store's breaker has closed
// again (10 s at most).
func (f *fixture) waitBreakerClosed(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); f.e.Store().BreakerState() != "closed"; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the breaker never closed")
		}
		f.check(t, userReq("probe"))
	}
}

// A body-keyed rule refuses a body it cannot read the same way every
// server would, rather than skip the rule: a client that compresses its
// body or sends it as UTF-16 would otherwise go unlimited, while its
// upstream (Express inflates gzip; Python reads UTF-16) reads the field.
// A shadow rule only reports.
func TestABodyKeyedRuleRefusesABodyItCannotRead(t *testing.T) {
	const src = "keys:\n  phone: {body: phone}\nrules:\n  - {id: otp, key: [phone], rate: 100, per: 1h}\n"
	utf16 := []byte{0xff, 0xfe}
	for _, c := range `{"phone":"8801711"}` {
		utf16 = append(utf16, byte(c), 0)
	}
	cases := []struct {
		name, ctype, encoding string
		body                  []byte
		truncated             bool
		status                int
	}{
		{"gzip", "application/json", "gzip", []byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"), false, http.StatusUnsupportedMediaType},
		{"UTF-16", "application/json", "", utf16, false, http.StatusUnsupportedMediaType},
		{"cut at the bytes read", "application/json", "", []byte(`{"phone":"8801711"`), true, http.StatusRequestEntityTooLarge},
		{"the field twice", "application/x-www-form-urlencoded", "", []byte("phone=1&phone=2"), false, http.StatusBadRequest},
	}
	for _, shadow := range []bool{false, true} {
		s := src
		if shadow {
			s = strings.Replace(s, "per: 1h}", "per: 1h, mode: shadow}", 1)
		}
		f := newFixture(t, s, Options{})
		for _, c := range cases {
			req := &rules.Request{Method: "POST", Path: "/otp", ClientIP: netip.MustParseAddr("203.0.113.7"),
				Header: http.Header{"Content-Type": {c.ctype}}, Body: c.body, BodyTruncated: c.truncated}
			if c.encoding != "" {
				req.Header.Set("Content-Encoding", c.encoding)
			}
			res := f.check(t, req)
			switch {
			case shadow && (!res.Allowed || res.Skipped != 1):
				t.Errorf("shadow, %s: allowed %v, %d skipped; want allowed, the shadow rule skipped", c.name, res.Allowed, res.Skipped)
			case !shadow && (res.Allowed || res.InvalidStatus != c.status || res.Skipped != 0):
				t.Errorf("%s: allowed %v, status %d, %d skipped; want refused %d", c.name, res.Allowed, res.InvalidStatus, res.Skipped, c.status)
			}
		}
	}
}

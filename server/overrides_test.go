package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/overrides"
)

func overridesFixture(t *testing.T, o Options) (*fixture, *overrides.Memory) {
	t.Helper()
	store := &overrides.Memory{}
	o.Overrides = &overrides.Follower{Store: store}
	return newFixture(t, o), store
}

// The API end to end in the process: set, read, replace only at the
// version read, check answers naming the override, remove.
func TestOverridesAPI(t *testing.T) {
	f, _ := overridesFixture(t, Options{Loopback: true})
	body := `{"rule":"per-user","keyValues":{"user":"u42"},"action":"limit","rate":3,"per":"1m","for":"1h","reason":"trial","by":"ops"}`
	w := f.do("PUT", "/v1/overrides", body)
	if w.Code != http.StatusCreated || w.Header().Get("ETag") != `"1"` {
		t.Fatalf("create: %d %s %s", w.Code, w.Header().Get("ETag"), w.Body)
	}
	var o overrides.Override
	json.Unmarshal(w.Body.Bytes(), &o)
	allowed := 0
	for range 5 {
		w := f.do("POST", "/v1/check", `{"request":{"method":"GET","path":"/","headers":{"X-User-ID":"u42"}}}`)
		var r CheckResponse
		json.Unmarshal(w.Body.Bytes(), &r)
		if r.Allowed {
			allowed++
		}
		if len(r.Overrides) != 1 || r.Overrides[0].ID != o.ID {
			t.Fatalf("a check the override applied to does not name it: %s", w.Body)
		}
	}
	if allowed != 3 {
		t.Fatalf("limited to 3 by the override: %d of 5 allowed", allowed)
	}
	if w := f.do("PUT", "/v1/overrides", body); w.Code != http.StatusPreconditionRequired {
		t.Fatalf("a blind overwrite: %d, want 428", w.Code)
	}
	if w := f.do("PUT", "/v1/overrides", body, "If-None-Match", "*"); w.Code != http.StatusPreconditionFailed {
		t.Fatalf("create-only over an existing one: %d, want 412", w.Code)
	}
	if w := f.do("PUT", "/v1/overrides", body, "If-Match", `"7"`); w.Code != http.StatusPreconditionFailed {
		t.Fatalf("a replace at a stale version: %d, want 412", w.Code)
	}
	if w := f.do("PUT", "/v1/overrides", strings.Replace(body, `"rate":3`, `"rate":4`, 1), "If-Match", `"1"`); w.Code != http.StatusOK || w.Header().Get("ETag") != `"2"` {
		t.Fatalf("a replace at its version: %d %s", w.Code, w.Body)
	}
	if w := f.do("PUT", "/v1/overrides", strings.Replace(body, `"u42"`, `"nobody"`, 1), "If-Match", "*"); w.Code != http.StatusPreconditionFailed {
		t.Fatalf("If-Match: * where none exists: %d %s, want 412", w.Code, w.Body)
	}
	if w := f.do("GET", "/v1/overrides/"+o.ID, ""); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"rate":4`) {
		t.Fatalf("get: %d %s", w.Code, w.Body)
	}
	if w := f.do("DELETE", "/v1/overrides/"+o.ID+"?by=ops&reason=over", "", "If-Match", `"1"`); w.Code != http.StatusPreconditionFailed {
		t.Fatalf("delete at a stale version: %d", w.Code)
	}
	if w := f.do("DELETE", "/v1/overrides/"+o.ID+"?by=ops&reason=over", ""); w.Code != http.StatusOK {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	if w := f.do("GET", "/v1/overrides", ""); !strings.Contains(w.Body.String(), `"overrides":[]`) || w.Header().Get("ETag") != `"3"` {
		t.Fatalf("list after: %s %s", w.Header().Get("ETag"), w.Body)
	}
}

// What an attacker or a careless operator sends is refused with the field
// at fault, and nothing changes.
func TestOverridesAPIRefusesBadInput(t *testing.T) {
	f, store := overridesFixture(t, Options{Loopback: true})
	ok := map[string]any{"rule": "per-user", "keyValues": map[string]string{"user": "u"}, "action": "exempt", "for": "1h", "reason": "r", "by": "b"}
	with := func(k string, v any) string {
		m := map[string]any{}
		for a, b := range ok {
			m[a] = b
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for _, c := range []struct {
		body, field string
		status      int
	}{
		{with("rule", "nope"), "rule", 400},
		{with("keyValues", map[string]string{"phone": "1"}), "keyValues", 400},
		{with("keyValues", nil), "key", 400},
		{with("key", strings.Repeat("k", 2000)), "keyValues", 400},
		{with("prefix", "u"), "keyValues", 400},
		{with("action", "nuke"), "action", 400},
		{with("action", "limit"), "rate", 400},
		{with("for", "-1h"), "for", 400},
		{with("for", nil), "expires", 400},
		{with("expires", "2020-01-01T00:00:00Z"), "for", 400},
		{strings.Replace(with("for", nil), `"by"`, `"expires":"2020-01-01T00:00:00Z","by"`, 1), "expires", 400},
		{strings.Replace(with("for", nil), `"by"`, `"expires":"2999-01-01T00:00:00Z","by"`, 1), "expires", 400},
		{strings.Replace(with("for", nil), `"by"`, `"expires":"tomorrow","by"`, 1), "expires", 400},
		{with("reason", ""), "reason", 400},
		{strings.Replace(with("", nil), `"by":"b"`, "\"by\":\"\xff\"", 1), "", 400},
		{with("per", "fast"), "per", 400},
		{strings.Replace(with("", nil), `"action"`, `"Action":"block","action"`, 1), "Action", 400},
		{strings.Replace(with("", nil), `"action"`, `"action":"block","action"`, 1), "action", 400},
		{`{"rule":"per-user","key":"` + strings.Repeat("x", 2<<20) + `"}`, "", 413},
	} {
		w := f.do("PUT", "/v1/overrides", c.body)
		var p struct{ Field string }
		json.Unmarshal(w.Body.Bytes(), &p)
		if w.Code != c.status || (c.field != "" && p.Field != c.field) || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%.120s: %d %s, want %d naming %q", c.body, w.Code, w.Body, c.status, c.field)
		}
	}
	for _, c := range []struct{ target, field string }{
		{"/v1/overrides/x?reason=r", "by"},
		{"/v1/overrides/x?by=b", "reason"},
	} {
		if w := f.do("DELETE", c.target, ""); w.Code != 400 || !strings.Contains(w.Body.String(), c.field) {
			t.Errorf("DELETE %s: %d %s", c.target, w.Code, w.Body)
		}
	}
	if w := f.do("PUT", "/v1/overrides", with("", nil), "If-Match", "seven"); w.Code != 400 {
		t.Errorf("If-Match seven: %d", w.Code)
	}
	if list, _, _ := store.Load(context.Background()); len(list) != 0 {
		t.Fatalf("bad requests changed the overrides: %d", len(list))
	}
	// A huge key value is counted, and overridden, as its digest.
	huge := with("keyValues", map[string]string{"user": strings.Repeat("v", 100_000)})
	if w := f.do("PUT", "/v1/overrides", huge); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), `"key":"~sha256:`) {
		t.Fatalf("a huge key value: %d %.200s", w.Code, w.Body)
	}
}

// Past MaxOverrides the next is refused (409) and the store keeps what it
// had; the admin guard covers the API as every admin endpoint.
func TestOverridesAPIIsBoundedAndGuarded(t *testing.T) {
	f, store := overridesFixture(t, Options{Loopback: true})
	for i := range overrides.MaxOverrides {
		o := overrides.Override{Rule: "per-user", Key: fmt.Sprint("k", i), Action: overrides.Exempt, Expires: time.Now().Add(time.Hour), Reason: "r", By: "b"}
		if _, _, err := store.Put(context.Background(), o, 0, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	w := f.do("PUT", "/v1/overrides", `{"rule":"per-user","key":"one more","action":"exempt","for":"1h","reason":"r","by":"b"}`)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "at most 10000") {
		t.Fatalf("one past the bound: %d %s", w.Code, w.Body)
	}
	if w := f.do("PUT", "/v1/overrides", `{}`, "Host", "attacker.example"); w.Code != http.StatusForbidden {
		t.Errorf("a foreign Host: %d", w.Code)
	}
	if w := f.do("DELETE", "/v1/overrides/x?by=b&reason=r", "", "Origin", "https://attacker.example"); w.Code != http.StatusForbidden {
		t.Errorf("a foreign Origin: %d", w.Code)
	}
	open, _ := overridesFixture(t, Options{Loopback: false})
	if w := open.do("GET", "/v1/overrides", ""); w.Code != http.StatusForbidden {
		t.Errorf("off loopback without a token: %d", w.Code)
	}
	tok, _ := overridesFixture(t, Options{Loopback: false, AdminToken: "t0k"})
	if w := tok.do("GET", "/v1/overrides", "", "Authorization", "Bearer nope"); w.Code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d", w.Code)
	}
	if w := tok.do("GET", "/v1/overrides", "", "Authorization", "Bearer t0k"); w.Code != http.StatusOK {
		t.Errorf("the token: %d", w.Code)
	}
}

// A key given as is is built as the rules build it from a request, so
// that an override applies to the requests it names: an IPv6 address as
// its /64, an API key hashed (never kept or listed as given). One the
// rule could never build is refused, naming the field.
func TestARawKeyIsBuiltAsTheRulesBuildIt(t *testing.T) {
	f := newFixtureOf(t, `
rules:
  - {id: per-ip, key: [ip], rate: 100, per: 1m}
  - {id: per-key, key: [api_key], rate: 100, per: 1m}
  - {id: pair, key: [user, ip], rate: 100, per: 1m}
`, Options{Loopback: true, Overrides: &overrides.Follower{Store: &overrides.Memory{}}})
	block := func(rule, key string) *httptest.ResponseRecorder {
		return f.do("PUT", "/v1/overrides", fmt.Sprintf(`{"rule":%q,"key":%q,"action":"block","for":"1h","reason":"r","by":"b"}`, rule, key))
	}
	blocked := func(ip, auth string) bool {
		w := f.do("POST", "/v1/check", fmt.Sprintf(`{"request":{"method":"GET","path":"/","ip":%q,"headers":{"Authorization":%q}}}`, ip, auth))
		var r CheckResponse
		json.Unmarshal(w.Body.Bytes(), &r)
		return !r.Allowed
	}
	if w := block("per-ip", "2001:db8:1:2::5"); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), `"key":"2001:db8:1:2::/64"`) {
		t.Fatalf("an IPv6 address: %d %s; want it kept as the /64 the rule counts", w.Code, w.Body)
	}
	if !blocked("2001:db8:1:2::9", "") || blocked("2001:db8:1:3::9", "") {
		t.Error("the block on an IPv6 address does not refuse its /64, or refuses beyond it")
	}
	if w := block("per-ip", "2001:db8:7:7::/64"); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), `"key":"2001:db8:7:7::/64"`) {
		t.Errorf("the /64 itself: %d %s", w.Code, w.Body)
	}
	if w := block("per-key", "k-stolen"); w.Code != http.StatusCreated || strings.Contains(w.Body.String(), "k-stolen") {
		t.Fatalf("an API key on a hashed source: %d %s; want it kept hashed", w.Code, w.Body)
	}
	if !blocked("192.0.2.1", "Bearer k-stolen") || blocked("192.0.2.1", "Bearer k-other") {
		t.Error("the block on a hashed API key does not refuse it, or refuses another")
	}
	if w := f.do("GET", "/v1/overrides", ""); strings.Contains(w.Body.String(), "k-stolen") {
		t.Errorf("the list shows the secret: %s", w.Body)
	}
	if w := block("per-key", "Bearer k-pasted"); w.Code != http.StatusCreated || !blocked("192.0.2.1", "Bearer k-pasted") {
		t.Errorf("a whole Authorization value given as the key: %d %s; want its token blocked", w.Code, w.Body)
	}
	for _, c := range []struct{ rule, key string }{
		{"per-ip", "not-an-address"},
		{"per-ip", "2001:db8::/48"}, // not the prefix the rule counts
		{"per-ip", "192.0.2.0/24"},
		{"per-ip", "fe80::1%eth0"}, // a zone is this host's
		{"per-ip", "192.0.2.1%eth0"},
		{"pair", "u1"},
	} {
		if w := block(c.rule, c.key); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"field":"key"`) {
			t.Errorf("rule %s, key %q: %d %s; want 400 naming key", c.rule, c.key, w.Code, w.Body)
		}
	}
}

// lostAnswers is a store across a network whose answers to changes are
// lost (or that refuses them for being late).
type lostAnswers struct {
	overrides.Memory
	err error
}

func (l *lostAnswers) Put(context.Context, overrides.Override, int64, time.Time) (*overrides.Override, *overrides.Override, error) {
	return nil, nil, l.err
}

func (l *lostAnswers) Delete(context.Context, string, int64, time.Time) (*overrides.Override, error) {
	return nil, l.err
}

// slowAnswer is a store whose answers to changes come as the caller's
// deadline passes, as Redis's may within its grace.
type slowAnswer struct{ overrides.Memory }

func (s *slowAnswer) Load(ctx context.Context) ([]*overrides.Override, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return s.Memory.Load(ctx)
}

func (s *slowAnswer) Version(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return s.Memory.Version(ctx)
}

func (s *slowAnswer) Put(ctx context.Context, o overrides.Override, v int64, now time.Time) (*overrides.Override, *overrides.Override, error) {
	<-ctx.Done()
	return s.Memory.Put(context.Background(), o, v, now)
}

// A change answered late is in force in the process it was made through
// when it is answered: the re-read has a wait of its own.
func TestAChangeAnsweredLateIsInForceWhenAnswered(t *testing.T) {
	fol := &overrides.Follower{Store: &slowAnswer{}}
	f := newFixture(t, Options{Loopback: true, Overrides: fol})
	if w := f.do("PUT", "/v1/overrides", `{"rule":"per-user","key":"u1","action":"block","for":"1h","reason":"r","by":"b"}`); w.Code != http.StatusCreated {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if len(fol.Current().Live(time.Now())) != 1 {
		t.Fatal("the change was answered before this process had it in force")
	}
}

// A change the store never made is answered "nothing changed"; one whose
// answer was lost is not: it is answered as unknown, and the change
// intended is logged, so that the audit trail has it either way.
func TestAChangeWithAnUnknownOutcomeIsSaidSoAndLogged(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{overrides.ErrNotMade, "nothing changed"},
		{fmt.Errorf("%w: i/o timeout", overrides.ErrOutcomeUnknown), "was made in the 2s allowed or will never be"},
	} {
		var log strings.Builder
		store := &lostAnswers{err: c.err}
		f := newFixture(t, Options{Loopback: true, Overrides: &overrides.Follower{Store: store}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		put := f.do("PUT", "/v1/overrides", `{"rule":"per-user","key":"u1","action":"block","for":"1h","reason":"abuse","by":"ops"}`)
		del := f.do("DELETE", "/v1/overrides/abc?by=ops&reason=over", "")
		for _, w := range []*httptest.ResponseRecorder{put, del} {
			if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), c.want) {
				t.Errorf("%v: %d %s, want 503 saying %q", c.err, w.Code, w.Body, c.want)
			}
		}
		if c.err == overrides.ErrNotMade {
			if strings.Contains(put.Body.String(), "will never be") {
				t.Errorf("a change not made is answered as unknown: %s", put.Body)
			}
			continue
		}
		for _, want := range []string{"outcome unknown", "by=ops", "reason=abuse", `intended="set block until`, "intended=remove"} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, log.String())
			}
		}
	}
}

// The live page lists the overrides in force, keys shown as every key on
// it is (hashed unless the rule says showKeys).
func TestTheLivePageListsTheOverridesInForce(t *testing.T) {
	f, _ := overridesFixture(t, Options{Loopback: true, Live: NewLive()})
	if w := f.do("PUT", "/v1/overrides", `{"rule":"per-user","keyValues":{"user":"u42"},"action":"block","for":"1h","reason":"abuse","by":"ops"}`); w.Code != 201 {
		t.Fatal(w.Code, w.Body)
	}
	w := f.do("GET", "/v1/ui/state", "")
	var st LiveState
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Overrides) != 1 || st.Overrides[0].Rule != "per-user" || st.Overrides[0].KeyHash == "" || st.Overrides[0].Key != "" || !strings.HasPrefix(st.Overrides[0].What, "block until ") || st.Overrides[0].Reason != "abuse" {
		t.Fatalf("the live state's overrides: %+v", st.Overrides)
	}
}

package rules

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/sluice-rl/sluice"
)

func TestRuleFileLoadsAsWritten(t *testing.T) {
	c, err := Load("testdata/every-request.json")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		key   string
		limit sluice.Limit
		fail  bool
	}{
		"user-default": {"user", sluice.Limit{Rate: 100, Period: time.Minute, Burst: 20}, false},
		"login":        {"user+ip", sluice.Limit{Rate: 10, Period: 15 * time.Minute}, false},
		"otp-sms":      {"phone", sluice.Limit{Rate: 3, Period: 10 * time.Minute}, true},
		"tenant":       {"tenant", sluice.Limit{Rate: 500, Period: time.Second, Burst: 1000}, false},
	}
	if len(c.Rules) != len(want) {
		t.Fatalf("%d rules, want %d", len(c.Rules), len(want))
	}
	for _, r := range c.Rules {
		w, ok := want[r.ID]
		if !ok {
			t.Fatalf("unexpected rule %q", r.ID)
		}
		var names []string
		for _, s := range r.Key {
			names = append(names, s.Name)
		}
		if got := strings.Join(names, "+"); got != w.key || r.Limit != w.limit || r.FailClosed != w.fail || r.Cost != 1 || r.Shadow {
			t.Errorf("%s: key %s limit %+v failClosed %v; want %s %+v %v", r.ID, got, r.Limit, r.FailClosed, w.key, w.limit, w.fail)
		}
	}
	// The default sources mean what the docs say.
	if s := c.Sources["user"]; s.Kind != FromHeader || s.Param != "X-User-Id" {
		t.Errorf("user source: %+v", s)
	}
	if s := c.Sources["phone"]; s.Kind != FromBody || s.Param != "phone" {
		t.Errorf("phone source: %+v", s)
	}
}

func TestFullModelLoads(t *testing.T) {
	c, err := Load("../examples/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	login := c.Rule("login")
	if login == nil || login.Limit.Algorithm != sluice.SlidingLog || len(login.CountOn) != 2 ||
		login.Penalty == nil || login.Penalty.After != 10 || login.Penalty.Block != 15*time.Minute {
		t.Fatalf("login: %+v", login)
	}
	if e := c.Rule("export"); e == nil || !e.Shadow || e.Cost != 50 || len(e.Match.Paths) != 1 {
		t.Fatalf("export: %+v", e)
	}
	if len(c.TrustedProxies) != 1 || c.TrustedProxies[0] != netip.MustParsePrefix("10.0.0.0/8") || c.IPv6Prefix != 64 {
		t.Fatalf("proxies %v, ipv6 prefix %d", c.TrustedProxies, c.IPv6Prefix)
	}
	if !c.NeedsBody() {
		t.Fatal("otp-sms keys on the body, NeedsBody is false")
	}
	if got := c.Rule("user-default").Summary(); !strings.Contains(got, "at most 20 at once, then 100 per minute") {
		t.Fatalf("summary %q", got)
	}
}

func TestEveryFaultIsReportedWithFileLineAndField(t *testing.T) {
	_, err := Load("testdata/bad.yaml")
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v is not Errors", err)
	}
	want := []string{
		"testdata/bad.yaml:2:29: keys.user.colour: unknown field",
		"testdata/bad.yaml:6:11: rules[0].rate: must be > 0, got 0",
		"testdata/bad.yaml:9:11: rules[1].key[0]: unknown key source \"nobody\"",
		"testdata/bad.yaml:12:16: rules[1].algorithm: unknown algorithm \"leaky-bucket\"",
		"rules[1].id: duplicate id \"a\" (first at line 4)",
		"testdata/bad.yaml:14:19: rules[2].match.path[0]: path pattern \"users/{id}\" must start with /",
		"testdata/bad.yaml:19:11: rules[2].cost: cost 3 is more than the burst 2",
		"testdata/bad.yaml:23:10: rules[3].per: period \"2fortnights\": unit must be one of ms, s, m, h, d, w (7 days)",
		"testdata/bad.yaml:24:5: rules[3].color: unknown field",
	}
	all := err.Error()
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("missing %q in:\n%s", w, all)
		}
	}
	if len(es) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(es), len(want), all)
	}
}

// The headers that match values and exemptions read are read by the rules
// (a proxy copies out only those).
func TestMatchValuesAndExemptionsAreRead(t *testing.T) {
	c, err := Parse("r.yaml", []byte("keys:\n  plan: {header: X-Plan}\nrules:\n  - {id: a, match: {values: {plan: [gold]}}, key: [ip], rate: 5, per: 1s, exempt: {header:X-Bot: [yes]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.ReadsHeader("X-Plan") || !c.ReadsHeader("X-Bot") {
		t.Fatal("the match's or the exemption's header is not read")
	}
	if got := c.HeaderNames(); !slices.Equal(got, []string{"X-Bot", "X-Plan"}) {
		t.Fatalf("HeaderNames %q, want the two, sorted", got)
	}
}

// Weeks, months and years are units; a fixed window may follow the
// calendar.
func TestCalendarUnitsLoad(t *testing.T) {
	c, err := Parse("r.yaml", []byte("rules:\n  - {id: m, key: [ip], rate: 1000, per: 1mo, algorithm: fixed-window, calendar: true, also: [{rate: 100, per: 1w}]}\n  - {id: y, key: [ip], rate: 5, per: 2w}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Rules {
		got = append(got, r.ID+" "+r.Limit.String())
	}
	if want := "[m 1000/1mo fixed-window calendar m.1w 100/1w fixed-window y 5/2w gcra]"; fmt.Sprint(got) != want {
		t.Fatalf("%v, want %s", got, want)
	}
}

// A rule's further windows load as rules of their own, named by their
// period, with the rule's match, key, cost and algorithm unless set.
func TestSeveralWindowsLoadAsRules(t *testing.T) {
	c, err := Parse("r.yaml", []byte("rules:\n  - {id: api, match: {path: /api/*}, key: [user], rate: 10, per: 1s, cost: 2, algorithm: fixed-window, also: [{rate: 100, per: 1m}, {rate: 1000, per: 1h, algorithm: sliding-window}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Rules {
		got = append(got, fmt.Sprintf("%s %v cost=%d key=%s path=%v", r.ID, r.Limit, r.Cost, r.Key[0].Name, len(r.Match.Paths)))
	}
	want := []string{"api 10/1s fixed-window cost=2 key=user path=1", "api.1m 100/1m fixed-window cost=2 key=user path=1", "api.1h 1000/1h sliding-window cost=2 key=user path=1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rules %q, want %q", got, want)
	}
}

func TestNoRulesOnlyWhenTheFileSaysSo(t *testing.T) {
	_, err := Parse("r.yaml", []byte("rules: []\n"))
	if err == nil || !strings.Contains(err.Error(), "r.yaml:1:") || !strings.Contains(err.Error(), "allowNoRules") {
		t.Fatalf("rules: [] gave %v, want an error at its line naming allowNoRules", err)
	}
	c, err := Parse("r.yaml", []byte("allowNoRules: true\nrules: []\n"))
	if err != nil || len(c.Rules) != 0 {
		t.Fatalf("allowNoRules: true: %v", err)
	}
}

func TestMalformedFilesAreErrors(t *testing.T) {
	for name, src := range map[string]string{
		"empty":          "",
		"not a mapping":  "- a\n- b\n",
		"no rules":       "keys: {}\n",
		"empty rules":    "rules: []\n",
		"values source":  "rules:\n  - {id: a, match: {values: {nobody: [x]}}, key: [ip], rate: 5, per: 1s}\n",
		"exempt cidr":    "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, exempt: {ip: [10.0.0.0/33]}}\n",
		"exempt empty":   "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, exempt: {}}\n",
		"override empty": "rules:\n  - {id: a, key: [user], rate: 5, per: 1s, overrides: [{rate: 50}]}\n",
		"override cost":  "rules:\n  - {id: a, key: [user], rate: 5, per: 1s, cost: 4, overrides: [{values: {user: [x]}, rate: 2}]}\n",
		"calendar hour":  "rules:\n  - {id: a, key: [ip], rate: 5, per: 1h, algorithm: fixed-window, calendar: true}\n",
		"calendar gcra":  "rules:\n  - {id: a, key: [ip], rate: 5, per: 1mo, calendar: true}\n",
		"window no per":  "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, also: [{rate: 50}]}\n",
		"window twice":   "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, also: [{rate: 50, per: 1m}, {rate: 60, per: 1m}]}\n",
		"window cost":    "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, cost: 5, also: [{rate: 4, per: 1m}]}\n",
		"window alg":     "rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, also: [{rate: 4, per: 1m, algorithm: leaky}]}\n",
		"unknown method": "rules:\n  - {id: a, match: {method: GTE}, key: [ip], rate: 5, per: 1m}\n",
		"bad in list":    "rules:\n  - {id: a, match: {method: [get, FROB]}, key: [ip], rate: 5, per: 1m}\n",
		"not allowed":    "allowNoRules: false\nrules: []\n",
		"rules not list": "rules: {id: a}\n",
		"bad yaml":       "rules: [\n",
		"wrong type":     "rules:\n  - {id: a, key: [ip], rate: ten, per: 1m}\n",
		"no key":         "rules:\n  - {id: a, rate: 1, per: 1m}\n",
		"window burst":   "rules:\n  - {id: a, key: [ip], rate: 5, per: 1m, burst: 7, algorithm: fixed-window}\n",
		"bad proxy":      "trustedProxies: [10.0.0.0/33]\nrules:\n  - {id: a, key: [ip], rate: 5, per: 1m}\n",
		"bad status":     "rules:\n  - {id: a, key: [ip], rate: 5, per: 1m, countOn: {status: [99]}}\n",
		"bad mode":       "rules:\n  - {id: a, key: [ip], rate: 5, per: 1m, mode: loud}\n",
		"bad id":         "rules:\n  - {id: 'a b', key: [ip], rate: 5, per: 1m}\n",
		"inline unknown": "rules:\n  - {id: a, key: ['form:x'], rate: 5, per: 1m}\n",
		"two sources":    "keys: {k: {header: A, query: b}}\nrules:\n  - {id: a, key: [k], rate: 5, per: 1m}\n",
	} {
		if _, err := Parse(name+".yaml", []byte(src)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), name+".yaml") {
			t.Errorf("%s: error does not name the file: %v", name, err)
		}
	}
}

func TestPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes     []string
		no      []string
	}{
		{"/login", []string{"/login"}, []string{"/login/", "/logins", "/", "/a/login", "login"}},
		{"/users/{id}", []string{"/users/42", "/users/u-1"}, []string{"/users", "/users/", "/users/42/x"}},
		{"/export/*", []string{"/export", "/export/a", "/export/a/b/c"}, []string{"/exports", "/ex"}},
		{"/a/*/c", []string{"/a/b/c"}, []string{"/a/c", "/a/b/d", "/a//c"}},
		{"/", []string{"/"}, []string{"/a"}},
	} {
		p, err := ParsePattern(tc.pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range tc.yes {
			if !p.Match(path) {
				t.Errorf("%s should match %s", tc.pattern, path)
			}
		}
		for _, path := range tc.no {
			if p.Match(path) {
				t.Errorf("%s should not match %s", tc.pattern, path)
			}
		}
	}
	for _, bad := range []string{"login", "/a{b}", "/{}", "/x*"} {
		if _, err := ParsePattern(bad); err == nil {
			t.Errorf("ParsePattern(%q) accepted", bad)
		}
	}
}

func TestKeysAreExtractedFromEverySource(t *testing.T) {
	c, err := Parse("k.yaml", []byte(`
keys:
  org: {query: org}
  session: {cookie: sid, hash: true}
rules:
  - {id: r, key: [user, ip, route, org, session, api_key, header:X-Region], match: {path: "/v1/{x}"}, rate: 5, per: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	req := &Request{
		Method: "GET", Path: "/v1/items", RawQuery: "a=1&org=acme%20inc", Host: "api.example:8443",
		ClientIP: netip.MustParseAddr("2001:db8:1:2:3:4:5:6"),
		Header: http.Header{
			"X-User-Id":     {"u42"},
			"Cookie":        {"a=b; sid=secret-session"},
			"Authorization": {"Bearer tok-123"},
			"X-Region":      {"eu"},
		},
	}
	route, ok := r.Match.Matches(req.Method, req.Host, req.Path)
	if !ok || route != "/v1/{x}" {
		t.Fatalf("match: %q %v", route, ok)
	}
	key, state := r.AppendKey(nil, req, route, 64)
	if state != KeyFound {
		t.Fatal("key missing")
	}
	k := string(key)
	for _, part := range []string{"3:u42", "2001:db8:1:2::/64", "GET /v1/{x}", "8:acme inc", "2:eu"} {
		if !strings.Contains(k, part) {
			t.Errorf("key %q lacks %q", k, part)
		}
	}
	for _, secret := range []string{"secret-session", "tok-123"} {
		if strings.Contains(k, secret) {
			t.Errorf("key %q contains the secret %q", k, secret)
		}
	}
	// A missing source means no key.
	delete(req.Header, "X-Region")
	if _, state := r.AppendKey(nil, req, route, 64); state != KeyMissing {
		t.Error("key built without X-Region")
	}
	// A wrong auth scheme is no api key.
	req.Header["X-Region"] = []string{"eu"}
	req.Header["Authorization"] = []string{"Basic abc"}
	if _, state := r.AppendKey(nil, req, route, 64); state != KeyMissing {
		t.Error("Basic credentials taken as a Bearer api key")
	}
}

func TestAttributesOverrideExtractionAndBodyKeys(t *testing.T) {
	c, _ := Parse("b.yaml", []byte("rules:\n  - {id: otp, key: [phone], rate: 3, per: 10m}\n"))
	r := c.Rules[0]
	for _, tc := range []struct {
		ct, body, want string
	}{
		{"application/json", `{"phone":"8801700000000","x":1}`, "8801700000000"},
		{"application/json; charset=utf-8", `{"phone":8801700000001}`, "8801700000001"},
		{"application/x-www-form-urlencoded", `a=1&phone=%2B8801`, "+8801"},
		{"text/plain", `phone=1`, "1"},                                      // a form in all but name: read as one
		{"text/plain", `{"phone":"2"}`, "2"},                                // JSON in all but name
		{"application/octet-stream", "\xef\xbb\xbf {\"phone\":\"3\"}", "3"}, // a byte order mark first
		{"application/json", `{"PHONE":"4"}`, "4"},                          // names in any case, as Go reads them
		{"application/json", `{"phone":"5","Phone":"5"}`, "5"},
		{"application/json", `{"phone":null}`, ""},
		{"application/json", `{"phone":"6"`, ""}, // incomplete
	} {
		req := &Request{Method: "POST", Path: "/otp", Header: http.Header{"Content-Type": {tc.ct}}, Body: []byte(tc.body)}
		key, state := r.AppendKey(nil, req, "", 64)
		if string(key) != tc.want || (state == KeyFound) != (tc.want != "") {
			t.Errorf("%s %s: key %q %v, want %q", tc.ct, tc.body, key, state, tc.want)
		}
	}
	req := &Request{Attributes: map[string]string{"phone": "555"}}
	if key, state := r.AppendKey(nil, req, "", 64); state != KeyFound || string(key) != "555" {
		t.Errorf("attribute: %q %v", key, state)
	}
}

func TestMultiSourceKeysCannotBeForged(t *testing.T) {
	c, _ := Parse("f.yaml", []byte("rules:\n  - {id: r, key: [header:A, header:B], rate: 3, per: 10m}\n"))
	r := c.Rules[0]
	k1, _ := r.AppendKey(nil, &Request{Header: http.Header{"A": {"x|1:y"}, "B": {"z"}}}, "", 64)
	k2, _ := r.AppendKey(nil, &Request{Header: http.Header{"A": {"x"}, "B": {"y|1:z"}}}, "", 64)
	if string(k1) == string(k2) {
		t.Fatalf("two different requests share the key %q", k1)
	}
}

func TestCeilingInWords(t *testing.T) {
	for _, tc := range []struct {
		l    sluice.Limit
		want string
	}{
		{sluice.Limit{Rate: 100, Period: time.Minute, Burst: 20}, "at most 20 at once, then 100 per minute"},
		{sluice.Limit{Rate: 10, Period: 15 * time.Minute, Algorithm: sluice.SlidingLog}, "at most 10 in any 15 minutes"},
		{sluice.Limit{Rate: 5, Period: time.Second, Algorithm: sluice.FixedWindow}, "at most 5 per second window (up to 10 across a window boundary)"},
	} {
		if got := Ceiling(tc.l); got != tc.want {
			t.Errorf("Ceiling(%v) = %q, want %q", tc.l, got, tc.want)
		}
	}
}

// examples/shop.json is the shop of examples/shop.yaml, field for field:
// the same key sources, proxies and rules (matches, algorithms, costs,
// modes, penalties), only the format differs.
func TestShopJSONIsTheShopYAML(t *testing.T) {
	j, err := Load("../examples/shop.json")
	if err != nil {
		t.Fatal(err)
	}
	y, err := Load("../examples/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Rules) != len(y.Rules) || len(y.Rules) < 6 {
		t.Fatalf("%d rules in JSON, %d in YAML", len(j.Rules), len(y.Rules))
	}
	strip := func(c *Config) *Config {
		cp := &Config{Sources: c.Sources, TrustedProxies: c.TrustedProxies, IPv6Prefix: c.IPv6Prefix, Paths: c.Paths, EnvoyDomains: c.EnvoyDomains}
		for _, r := range c.Rules {
			r2 := *r
			r2.Line = 0 // where a rule starts differs between the files
			cp.Rules = append(cp.Rules, &r2)
		}
		return cp
	}
	js, ys := strip(j), strip(y)
	for i := range ys.Rules {
		if !reflect.DeepEqual(js.Rules[i], ys.Rules[i]) {
			t.Errorf("rule %d differs:\nJSON %+v\nYAML %+v", i, js.Rules[i], ys.Rules[i])
		}
	}
	if !reflect.DeepEqual(js, ys) {
		t.Errorf("the files' settings differ:\nJSON %+v\nYAML %+v", js, ys)
	}
}

func TestLoadAllMergesFilesAndRefusesDuplicateIDs(t *testing.T) {
	c, err := LoadAll("testdata/every-request.json", "testdata/extra.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules) != 5 || c.Rule("search") == nil || c.Rule("login") == nil {
		t.Fatalf("%d rules", len(c.Rules))
	}
	if _, err := LoadAll("../examples/shop.json", "../examples/shop.json"); err == nil || !strings.Contains(err.Error(), "duplicate id") {
		t.Fatalf("duplicates across files: %v", err)
	}
	if _, err := LoadAll("testdata/every-request.json", "testdata/bad.yaml"); err == nil {
		t.Fatal("a bad file in the set was accepted")
	}
}

// A hashed source keeps secrets out of keys, and still gives every secret a
// count of its own: the digest is of the value, not a constant, and is the
// same for the same value.
func TestHashedSourceGivesEverySecretItsOwnKey(t *testing.T) {
	c, err := Parse("t.yaml", []byte("rules:\n  - {id: r, key: [api_key], rate: 5, per: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	key := func(token string) string {
		req := &Request{Header: http.Header{"Authorization": {"Bearer " + token}}}
		k, state := r.AppendKey(nil, req, "", 64)
		if state != KeyFound {
			t.Fatalf("no key for %q", token)
		}
		return string(k)
	}
	seen := map[string]string{}
	for i := range 1000 {
		tok := fmt.Sprintf("tok-%d", i)
		k := key(tok)
		if prev, dup := seen[k]; dup {
			t.Fatalf("tokens %q and %q share the key %q", prev, tok, k)
		}
		seen[k] = tok
		if strings.Contains(k, tok) || len(k) != 32 {
			t.Fatalf("key %q of %q is not a 128-bit hex digest", k, tok)
		}
		if key(tok) != k {
			t.Fatalf("the same token gave two keys")
		}
	}
}

// A YAML syntax error names the line and column of the fault, not the line
// before it; a file in UTF-16 without a byte order mark is refused by name;
// a UTF-8 byte order mark, or UTF-16 with one, is read.
func TestSyntaxErrorsPointAtTheFault(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"rules:\n  - {id: a, key: [ip], rate: 1, per: 1s}\n  - {id: b, key: [ip, rate: 1, per: 1s}\n", "f.yaml:3:39: "},
		{"rules:\n  - id: a\n    key: [ip]\n   rate: 1\n", "f.yaml:4:4: "},
		{"rules:\n\t- id: a\n", "f.yaml:2:1: "},
	} {
		_, err := Parse("f.yaml", []byte(tc.src))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want it at %s", tc.src, err, tc.want)
		}
	}
	src := "rules:\n  - {id: a, key: [ip], rate: 1, per: 1s}\n"
	utf16 := func(bigEndian, bom bool) []byte {
		var b []byte
		if bom {
			b = append(b, 0xff, 0xfe)
			if bigEndian {
				b = []byte{0xfe, 0xff}
			}
		}
		for _, c := range []byte(src) {
			if bigEndian {
				b = append(b, 0, c)
			} else {
				b = append(b, c, 0)
			}
		}
		return b
	}
	for _, be := range []bool{false, true} {
		if _, err := Parse("f.yaml", utf16(be, false)); err == nil || !strings.Contains(err.Error(), "without a byte order mark") {
			t.Errorf("UTF-16 (big endian %v) without a BOM: %v", be, err)
		}
		if c, err := Parse("f.yaml", utf16(be, true)); err != nil || len(c.Rules) != 1 {
			t.Errorf("UTF-16 (big endian %v) with a BOM: %v", be, err)
		}
	}
	if c, err := Parse("f.yaml", append([]byte{0xef, 0xbb, 0xbf}, src...)); err != nil || len(c.Rules) != 1 {
		t.Errorf("UTF-8 with a BOM: %v", err)
	}
}

// An exempt network is matched on the address itself: no allocation per
// request, IPv4-mapped IPv6 included.
func TestExemptNetworkMatchesWithoutAllocating(t *testing.T) {
	c, err := Parse("r.yaml", []byte("rules:\n  - {id: a, key: [ip], rate: 5, per: 1s, exempt: {ip: [10.0.0.0/8, 2001:db8::/32]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	for addr, exempt := range map[string]bool{"10.1.2.3": true, "::ffff:10.1.2.3": true, "2001:db8::1": true, "203.0.113.7": false} {
		req := &Request{ClientIP: netip.MustParseAddr(addr)}
		if got := !r.Selects(req, "/"); got != exempt {
			t.Errorf("%s: exempt %v, want %v", addr, got, exempt)
		}
		if n := testing.AllocsPerRun(100, func() { r.Selects(req, "/") }); n != 0 {
			t.Errorf("%s: %.0f allocations per request", addr, n)
		}
	}
	if !r.Selects(&Request{}, "/") {
		t.Error("a request without an address was exempted")
	}
}

// `sluice check` says what each rule does with a request that lacks its
// key, and warns where such a request goes uncounted.
func TestCheckSaysWhatAMissingKeyDoes(t *testing.T) {
	c, err := Parse("missing.yaml", []byte(`
keys:
  phone: {body: phone}
rules:
  - id: fallback
    match: {path: /a}
    key: phone
    rate: 3
    per: 10m
  - id: other-fallback
    match: {path: /b}
    key: phone
    fallbackKey: [ip, route]
    rate: 3
    per: 10m
  - id: reject
    match: {path: /c}
    key: phone
    onMissingKey: reject
    rate: 3
    per: 10m
  - id: skip
    match: {path: /d}
    key: phone
    onMissingKey: skip
    rate: 3
    per: 10m
  - id: address
    match: {path: /e}
    key: ip
    rate: 3
    per: 10m
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"fallback":       "per phone (without it: per ip)",
		"other-fallback": "per phone (without it: per ip+route)",
		"reject":         "per phone (without it: refused)",
		"skip":           "per phone (without it: not counted)",
		"address":        "per ip: ",
	}
	for id, w := range want {
		if got := c.Rule(id).Summary(); !strings.Contains(got, w) {
			t.Errorf("%s: summary %q, want it to say %q", id, got, w)
		}
	}
	warnings := c.Warnings()
	var skipWarned int
	for _, w := range warnings {
		if strings.Contains(w, "onMissingKey: skip") {
			skipWarned++
			if !strings.Contains(w, "rule skip ") || !strings.Contains(w, "missing.yaml:") {
				t.Errorf("warning %q does not name the rule and its line", w)
			}
		}
	}
	if skipWarned != 1 {
		t.Errorf("warnings %q: want one about the skipping rule", warnings)
	}
}

// A key source's normalize rewrites each spelling an application treats
// as one into one key: for a phone, its digits; for an email, trimmed and
// in lower case. Attributes (the JSON API, Envoy) are rewritten alike.
func TestNormalizeMakesSpellingsOneKey(t *testing.T) {
	c, err := Parse("norm.yaml", []byte(`
keys:
  phone: {body: phone, normalize: digits}
  email: {header: X-Email, normalize: [trim, lower]}
rules:
  - {id: otp, key: [phone], rate: 3, per: 10m}
  - {id: mail, key: [email], rate: 3, per: 10m}
`))
	if err != nil {
		t.Fatal(err)
	}
	key := func(r *Rule, req *Request) (string, KeyState) {
		if req.Header == nil {
			req.Header = http.Header{}
		}
		b, st := r.AppendKey(nil, req, "", 64)
		return string(b), st
	}
	otp, mail := c.Rule("otp"), c.Rule("mail")
	for _, body := range []string{`{"phone":"+880 1799-999999"}`, `{"phone":"8801799999999"}`, `{"phone":8801799999999}`, `{"phone":8.801799999999e12}`, "phone=%2B880%281799%29999999", `{"phone":"(880) 1799 999999 "}`} {
		h := http.Header{"Content-Type": {"application/json"}}
		if body[0] != '{' {
			h.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if k, st := key(otp, &Request{Body: []byte(body), Header: h}); k != "8801799999999" || st != KeyFound {
			t.Errorf("%s: key %q (%d), want 8801799999999", body, k, st)
		}
	}
	if k, st := key(otp, &Request{Attributes: map[string]string{"phone": "+880-1799-999999"}}); k != "8801799999999" || st != KeyFound {
		t.Errorf("attribute: key %q (%d)", k, st)
	}
	if _, st := key(otp, &Request{Body: []byte(`{"phone":"+ - ()"}`), Header: http.Header{"Content-Type": {"application/json"}}}); st != KeyMissing {
		t.Errorf("a phone without digits: state %d, want missing", st)
	}
	for _, v := range []string{" Ana@Example.com", "ana@example.COM\t", "ana@example.com"} {
		if k, _ := key(mail, &Request{Header: http.Header{"X-Email": {v}}}); k != "ana@example.com" {
			t.Errorf("%q: key %q", v, k)
		}
	}
	if _, err := Parse("bad.yaml", []byte("keys:\n  p: {body: p, normalize: e164}\nrules: [{id: a, key: [p], rate: 1, per: 1s}]\n")); err == nil || !strings.Contains(err.Error(), "unknown normalization") {
		t.Errorf("an unknown normalization: %v", err)
	}
}

// An IPv6 zone names the receiving interface, not the client: a client
// address is counted without it, and exempt networks contain it.
func TestZonesAreNotPartOfAnAddress(t *testing.T) {
	c, err := Parse("zone.yaml", []byte("ipv6Prefix: 128\nrules:\n  - {id: a, key: [ip], rate: 1, per: 1s, exempt: {ip: [fe80::/10]}}\n  - {id: b, key: [ip], rate: 1, per: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, ip := range []string{"fe80::1%eth0", "fe80::1%eth1", "fe80::1"} {
		req := &Request{ClientIP: netip.MustParseAddr(ip), Header: http.Header{}}
		k, _ := c.Rule("b").AppendKey(nil, req, "", 128)
		keys = append(keys, string(k))
		if c.Rule("a").Selects(req, "") {
			t.Errorf("%s is not exempt", ip)
		}
	}
	if keys[0] != "fe80::1" || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Errorf("keys %q, want fe80::1 for each", keys)
	}
}

// Every decimal digit Unicode knows is its ASCII digit under normalize:
// digits, as Python's int() reads them.
func TestDigitsOfEveryScriptAreTheirASCIIDigit(t *testing.T) {
	// Unicode's table of decimal digits lists runs of ten (or rows of
	// them), each from its zero: a digit's value is its distance from the
	// start of its range, modulo ten.
	checked := 0
	for _, rg := range unicode.Nd.R16 {
		for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
			if r >= 0x80 && asciiDigit(r) != '0'+(r-rune(rg.Lo))%10 {
				t.Fatalf("%U: %q", r, asciiDigit(r))
			}
			checked++
		}
	}
	for _, rg := range unicode.Nd.R32 {
		for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
			if asciiDigit(r) != '0'+(r-rune(rg.Lo))%10 {
				t.Fatalf("%U: %q", r, asciiDigit(r))
			}
			checked++
		}
	}
	for _, c := range []struct {
		in, want string
	}{
		{"８８０１７９９９９９９９９", "8801799999999"}, // fullwidth
		{"٨٨٠١٧٩٩٩٩٩٩٩٩", "8801799999999"}, // Arabic-Indic
		{"𝟖𝟖𝟎", "880"},                     // mathematical bold
		{"𝟾𝟾𝟶", "880"},                     // mathematical monospace, the fifth run in a row
		{"+880 (1799) 999-999", "8801799999999"},
		// As int() reads them: leading zeros go, so the international
		// prefix 00 and "+" are one key, and an attacker cannot make keys
		// of its own by writing zeros in front.
		{"00880 1799 999999", "8801799999999"},
		{"0+0880-1799-999999", "8801799999999"},
		{"0000", "0"},
		{"0", "0"},
		{"01799999999", "1799999999"},
	} {
		if got := NormDigits.apply(c.in); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
	if checked < 500 {
		t.Fatalf("only %d digits checked", checked)
	}
}

// A rule set's version names its contents: the same bytes, the same
// version; any change, another; several files, one of their own.
func TestVersionNamesTheContents(t *testing.T) {
	a1, err := Parse("a.yaml", []byte("rules:\n  - id: a\n    key: [user]\n    rate: 10\n    per: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := Parse("elsewhere.yaml", []byte("rules:\n  - id: a\n    key: [user]\n    rate: 10\n    per: 1m\n"))
	b, _ := Parse("a.yaml", []byte("rules:\n  - id: a\n    key: [user]\n    rate: 11\n    per: 1m\n"))
	if !strings.HasPrefix(a1.Version, "sha256:") || len(a1.Version) != len("sha256:")+12 {
		t.Fatalf("version %q", a1.Version)
	}
	if a1.Version != a2.Version || a1.Version == b.Version {
		t.Fatalf("versions: same bytes %q %q, changed %q", a1.Version, a2.Version, b.Version)
	}
	c, _ := Parse("c.yaml", []byte("rules:\n  - id: c\n    key: [ip]\n    rate: 1\n    per: 1s\n"))
	ac, err := Merge(a1, c)
	if err != nil {
		t.Fatal(err)
	}
	bc, _ := Merge(b, c)
	if ac.Version == a1.Version || ac.Version == c.Version || ac.Version == bc.Version {
		t.Fatalf("merged versions: %q (of %q, %q), %q", ac.Version, a1.Version, c.Version, bc.Version)
	}
}

// Faults are listed in the file's order, whatever order the sections are
// checked in; a second `also` window of one period is named as such.
func TestFaultsComeInLineOrder(t *testing.T) {
	src := "rules:\n  - {id: a, key: [ip], rate: 10, per: 1s, also: [{rate: 100, per: 1m}, {rate: 200, per: 1m}]}\n  - {id: b, key: [nosuch], rate: 1, per: 1s}\npriority: {levels: []}\n"
	_, err := Parse("o.yaml", []byte(src))
	var es Errors
	if !errors.As(err, &es) || len(es) < 3 {
		t.Fatalf("want 3 faults or more, got %v", err)
	}
	for i := 1; i < len(es); i++ {
		if es[i].Line < es[i-1].Line {
			t.Fatalf("fault %d (line %d) after line %d:\n%v", i, es[i].Line, es[i-1].Line, err)
		}
	}
	if !strings.Contains(err.Error(), "a second window of 1m") {
		t.Fatalf("the duplicate window: %v", err)
	}
}

// "rate: 100/m" is refused with the two fields to write instead.
func TestARateWrittenAsALimitGetsAHint(t *testing.T) {
	_, err := Parse("r.yaml", []byte("rules:\n  - {id: a, key: [ip], rate: 100/m, per: 1m}\n"))
	if err == nil || !strings.Contains(err.Error(), "write rate: 100 and per: 1m") {
		t.Fatalf("%v", err)
	}
}

// onSlowStore reads share, wait, or a wait of its own, and refuses
// anything else with the field named.
func TestOnSlowStoreReadsShareWaitOrAWait(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
		err   string
	}{
		{"share", 0, ""},
		{"wait", DefaultSlowStoreWait, ""},
		{"{wait: 500ms}", 500 * time.Millisecond, ""},
		{"{wait: 10s}", MaxSlowStoreWait, ""},
		{"{wait: 11s}", 0, "f.yaml:2:80: rules[0].onSlowStore.wait: at most 10s, got 11s"},
		{"{wait: -1s}", 0, "rules[0].onSlowStore.wait: period \"-1s\""},
		{"{until: 1s}", 0, "rules[0].onSlowStore.until: unknown field"},
		{"queue", 0, "f.yaml:2:73: rules[0].onSlowStore: want share (the default"},
	} {
		src := "rules:\n  - {id: a, key: [ip], rate: 1, per: 1s, failMode: closed, onSlowStore: " + tc.value + "}\n"
		c, err := Parse("f.yaml", []byte(src))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.value, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.value, err)
		case c.Rules[0].SlowStoreWait != tc.want:
			t.Errorf("%s: waits %v, want %v", tc.value, c.Rules[0].SlowStoreWait, tc.want)
		}
	}
}

// status reads 429 or 503, the two statuses a refusal by a limit is
// answered with, and refuses any other with the field named.
func TestStatusReads429Or503(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  int
		err   string
	}{
		{"429", 429, ""},
		{"503", 503, ""},
		{"418", 0, "f.yaml:2:50: rules[0].status: want 429 (Too Many Requests, the default) or 503"},
		{"200", 0, "rules[0].status: want 429"},
		{"busy", 0, "rules[0].status: want an integer"},
	} {
		src := "rules:\n  - {id: a, key: [ip], rate: 1, per: 1s, status: " + tc.value + "}\n"
		c, err := Parse("f.yaml", []byte(src))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.value, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.value, err)
		case c.Rules[0].RefusalStatus != tc.want:
			t.Errorf("%s: status %d, want %d", tc.value, c.Rules[0].RefusalStatus, tc.want)
		}
	}
	c, err := Parse("f.yaml", []byte("rules:\n  - {id: a, key: [ip], rate: 1, per: 1s, status: 503}\n"))
	if err != nil || !strings.Contains(c.Rules[0].Summary(), "; refused with 503") {
		t.Fatalf("%v: the summary of a 503 rule: %q", err, c.Rules[0].Summary())
	}
}

// notPath takes paths out of a rule's match, whatever else matches them.
func TestNotPathTakesPathsOutOfAMatch(t *testing.T) {
	c, err := Parse("f.yaml", []byte(`rules:
  - {id: site, match: {notPath: [/api/*, /login]}, key: [ip], rate: 1, per: 1s}
  - {id: api, match: {path: /api/*, notPath: /api/health}, key: [ip], rate: 1, per: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	site, api := &c.Rules[0].Match, &c.Rules[1].Match
	for _, tc := range []struct {
		path      string
		site, api bool
	}{
		{"/", true, false},
		{"/static/a.css", true, false},
		{"/login", false, false},
		{"/login/x", true, false},
		{"/api", false, true},
		{"/api/users/7", false, true},
		{"/api/health", false, false},
	} {
		_, s := site.Matches("GET", "h", tc.path)
		_, a := api.Matches("GET", "h", tc.path)
		if s != tc.site || a != tc.api {
			t.Errorf("%s: site %v api %v, want %v %v", tc.path, s, a, tc.site, tc.api)
		}
	}
	if got := c.Rules[1].Summary(); !strings.Contains(got, "/api/* except /api/health") {
		t.Errorf("summary %q", got)
	}
	if _, err := Parse("f.yaml", []byte("rules:\n  - {id: a, match: {notPath: api}, key: [ip], rate: 1, per: 1s}\n")); err == nil || !strings.Contains(err.Error(), "rules[0].match.notPath[0]") {
		t.Errorf("a pattern without its slash: %v", err)
	}
}

// A rule's keyLimits list is read under its former name, overrides, too:
// the same rules, ids and exemptions either way.
func TestKeyLimitsAreReadUnderTheirFormerName(t *testing.T) {
	var got []string
	for _, list := range []string{"keyLimits", "overrides"} {
		c, err := Parse("k.yaml", []byte("rules:\n  - {id: per-key, key: [api_key], rate: 100, per: 1m, "+list+": [{values: {api_key: [gold]}, rate: 1000}]}\n"))
		if err != nil {
			t.Fatalf("%s: %v", list, err)
		}
		got = append(got, fmt.Sprint(len(c.Rules), c.Rules[1].ID, c.Rules[1].KeyLimitOf, c.Rules[1].Limit.Rate, len(c.Rules[0].Exempt)))
	}
	if got[0] != got[1] || got[0] != "2per-key.key-limit-1per-key1000 1" {
		t.Fatalf("keyLimits %q, overrides %q; want both 2 rules, per-key.key-limit-1 of per-key at 1000, the rule exempting its keys", got[0], got[1])
	}
}

package nginx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
)

// importRules translates conf and parses the result.
func importRules(t *testing.T, conf string) (*rules.Config, string) {
	t.Helper()
	out, err := Import("nginx.conf", []byte(conf))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	cfg, err := rules.Parse("out.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return cfg, string(out)
}

func rule(t *testing.T, cfg *rules.Config, id string) *rules.Rule {
	t.Helper()
	if r := cfg.Rule(id); r != nil {
		return r
	}
	t.Fatalf("no rule %s", id)
	return nil
}

// nginx's arithmetic: nodelay admits burst+1 at once (gcra), no nodelay
// paces the burst (a leaky queue of burst), status and dry run carried.
func TestBurstsTranslateAsNginxCountsThem(t *testing.T) {
	cfg, out := importRules(t, `
http {
    limit_req_zone $binary_remote_addr zone=api:10m rate=10r/s;
    limit_req_zone $http_x_api_key zone=keys:10m rate=30r/m;
    limit_req_zone $remote_addr zone=paced:1m rate=2r/s;
    limit_req_zone $binary_remote_addr zone=strict:1m rate=1r/s;
    limit_req_zone $binary_remote_addr zone=staged:1m rate=5r/s;
    limit_req_status 429;
    server {
        listen 127.0.0.1:8088;
        location /api/ { limit_req zone=api burst=20 nodelay; }
        location = /login { limit_req zone=keys burst=5 delay=5; limit_req_dry_run on; }
        location /paced/ { limit_req zone=paced burst=4; limit_req_status 503; }
        location /strict/ { limit_req zone=strict; }
        location /staged/ { limit_req zone=staged burst=10 delay=4; }
    }
}`)
	for _, tc := range []struct {
		id    string
		limit sluice.Limit
	}{
		{"api", sluice.Limit{Rate: 10, Period: time.Second, Burst: 21, Algorithm: sluice.GCRA}},
		{"keys", sluice.Limit{Rate: 30, Period: time.Minute, Burst: 6, Algorithm: sluice.GCRA}},
		{"paced", sluice.Limit{Rate: 2, Period: time.Second, Burst: 4, Algorithm: sluice.LeakyQueue}},
		{"strict", sluice.Limit{Rate: 1, Period: time.Second, Burst: 1, Algorithm: sluice.GCRA}},
		{"staged", sluice.Limit{Rate: 5, Period: time.Second, Burst: 10, Algorithm: sluice.LeakyQueue}},
	} {
		if got := rule(t, cfg, tc.id).Limit; got != tc.limit {
			t.Errorf("%s: %+v, want %+v\n%s", tc.id, got, tc.limit, out)
		}
	}
	if r := rule(t, cfg, "keys"); !r.Shadow || r.RefusalStatus != 0 || r.MissingKey != rules.MissingSkip || r.Key[0].Param != "X-Api-Key" {
		t.Errorf("keys: shadow %v, status %d, missing key %v, key %+v", r.Shadow, r.RefusalStatus, r.MissingKey, r.Key[0])
	}
	if r := rule(t, cfg, "staged"); r.DelayAfter != 4 {
		t.Errorf("staged: delayAfter %d, want nginx's delay=4", r.DelayAfter)
	}
	if r := rule(t, cfg, "paced"); r.RefusalStatus != 503 || r.Shadow {
		t.Errorf("paced: status %d shadow %v", r.RefusalStatus, r.Shadow)
	}
}

// A request is counted by the limits of its one location; inherited
// limits stop where a location sets its own.
func TestEachZoneMatchesTheRequestsItsLocationsTake(t *testing.T) {
	cfg, out := importRules(t, `
http {
    limit_req_zone $binary_remote_addr zone=site:10m rate=100r/s;
    limit_req_zone $binary_remote_addr zone=api:10m rate=10r/s;
    limit_req_zone $binary_remote_addr zone=otp:10m rate=1r/m;
    server {
        limit_req zone=site burst=50 nodelay;
        location / { }
        location /api/ {
            limit_req zone=api burst=10 nodelay;
            location /api/otp { limit_req zone=otp; }
            location /api/open/ { }
        }
        location = /health { }
    }
}`)
	site, api, otp := rule(t, cfg, "site"), rule(t, cfg, "api"), rule(t, cfg, "otp")
	for _, tc := range []struct {
		path           string
		site, api, otp bool
	}{
		{"/", true, false, false},
		{"/shop/cart", true, false, false},
		{"/api/users", false, true, false},
		{"/api/open/docs", false, true, false}, // inherits /api/'s limit
		{"/api/otp", false, false, true},
		{"/api/otp/send", false, false, true},
		{"/health", true, false, false}, // inherits the server's
	} {
		p := cfg.Paths.MatchForm(tc.path)
		_, s := site.Match.Matches("GET", "h", p)
		_, a := api.Match.Matches("GET", "h", p)
		_, o := otp.Match.Matches("GET", "h", p)
		if s != tc.site || a != tc.api || o != tc.otp {
			t.Errorf("%s: site %v api %v otp %v, want %v %v %v\n%s", tc.path, s, a, o, tc.site, tc.api, tc.otp, out)
		}
	}
}

// What has no counterpart is refused with the line that holds it.
func TestWhatCannotBeTranslatedIsRefusedByLine(t *testing.T) {
	for _, tc := range []struct{ name, conf, want string }{
		{"a map's variable", "http {\nlimit_req_zone $limit zone=a:1m rate=1r/s; }", "nginx.conf:2: limit_req_zone key $limit: cannot key on $limit"},
		{"limit_conn", "http {\nserver {\nlimit_conn addr 10; } }", "nginx.conf:3: limit_conn: sluice limits requests, not connections"},
		{"a regex location", "http {\nlimit_req_zone $remote_addr zone=a:1m rate=1r/s;\nserver { limit_req zone=a;\nlocation ~ \\.php$ { } } }", "nginx.conf:4: a regex location"},
		{"an unknown zone", "http { server {\nlimit_req zone=nope; } }", "nginx.conf:2: limit_req zone=nope: no limit_req_zone defines it"},
		{"another status", "http {\nlimit_req_status 444; }", "nginx.conf:2: limit_req_status 444"},
		{"one zone, two bursts", "http {\nlimit_req_zone $remote_addr zone=a:1m rate=1r/s;\nserver { location /x/ {\nlimit_req zone=a burst=1; }\nlocation /y/ {\nlimit_req zone=a burst=2; } } }", "zone a is used with other settings"},
		{"a zone nested across another", "http {\nlimit_req_zone $remote_addr zone=a:1m rate=1r/s;\nlimit_req_zone $remote_addr zone=b:1m rate=1r/s;\nserver { location / { limit_req zone=a; }\nlocation /api/ { limit_req zone=b; }\nlocation /api/v2/ { limit_req zone=a; } } }", "zone a: one rule cannot match exactly"},
		{"a block left open", "http {\nserver {", "a block is not closed"},
	} {
		_, err := Import("nginx.conf", []byte(tc.conf))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// Several servers are told apart by host; include directives are read in
// place.
func TestServersByHostAndIncludes(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sites"), 0o755)
	os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte("http {\n  limit_req_zone $binary_remote_addr zone=a:1m rate=5r/s;\n  include sites/*.conf;\n}\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "sites", "a.conf"), []byte("server { server_name a.example; limit_req zone=a burst=2 nodelay; }\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "sites", "b.conf"), []byte("server { server_name b.example; }\n"), 0o600)
	out, err := ImportFile(filepath.Join(dir, "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.Parse("out.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	r := rule(t, cfg, "a")
	if _, ok := r.Match.Matches("GET", "a.example", "/x"); !ok {
		t.Errorf("a.example is not limited:\n%s", out)
	}
	if _, ok := r.Match.Matches("GET", "b.example", "/x"); ok {
		t.Errorf("b.example is limited by a's zone:\n%s", out)
	}
}

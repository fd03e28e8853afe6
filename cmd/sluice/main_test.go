package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// runCLI runs the built binary, as a user types the command: the
// race-instrumented test binary would run simulations and estimates many
// times slower and prove less.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return proctest.RunOutput(t, args...)
}

func TestSimulatePrintsTheScenarioInEachFormat(t *testing.T) {
	code, out, errs := runCLI(t, "simulate", "gcra-vs-token-bucket")
	if code != 0 || !strings.Contains(out, "rejected") || !strings.Contains(out, "agree on every request") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	code, out, _ = runCLI(t, "simulate", "--format", "json", "gcra-vs-token-bucket")
	var v struct{ Agree bool }
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !v.Agree {
		t.Fatalf("json: exit %d, output %q", code, out)
	}
	code, out, _ = runCLI(t, "simulate", "gcra-vs-token-bucket", "--format", "csv")
	if code != 0 || len(strings.Split(strings.TrimSpace(out), "\n")) != 9 {
		t.Fatalf("csv: exit %d, want a header and 8 rows:\n%s", code, out)
	}
}

func TestBadInvocationsExitTwoWithAReason(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"simulate"}, {"simulate", "nope"}, {"simulate", "gcra-vs-token-bucket", "--format", "xml"}, {"version", "x"}} {
		code, _, errs := runCLI(t, args...)
		if code != 2 || errs == "" {
			t.Errorf("sluice %v: exit %d, stderr %q; want exit 2 and a reason", args, code, errs)
		}
	}
}

// A command given wrong names what is wrong in a line or two, not a page
// of usage, and exits 2; a command that fails while running exits 1.
func TestMistakesAreNamedAndExitCodesAgree(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gateway", "--config", "../../examples/shop.yaml"}, "--upstream"},
		{[]string{"serve"}, "--config"},
		{[]string{"serve", "--bogus"}, "-bogus"},
		{[]string{"estimate", "--keys", "1M"}, "--limit"},
		{[]string{"replay", "x.log"}, "--config"},
		{[]string{"check"}, "no file"},
		{[]string{"simulate"}, "gcra-vs-token-bucket"},
		{[]string{"serve", "--config", "../../examples/shop.yaml", "--tls-cert", "c.pem"}, "--tls-key"},
		{[]string{"estimate", "--keys", "1M", "--limit", "bad"}, "sluice estimate: --limit: limit \"bad\""},
		{[]string{"estimate", "--keys", "10x", "--limit", "1/1s"}, "--keys"},
		{[]string{"test", "../../examples/shop.yaml"}, "a test file"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) || strings.Count(errs, "\n") > 2 || strings.Contains(errs, "Usage:") {
			t.Errorf("sluice %v: exit %d, stderr %q; want exit 2 and a line naming %s", tc.args, code, errs, tc.want)
		}
	}
	for _, args := range [][]string{
		{"check", "../../rules/testdata/bad.yaml"},
		{"replay", "--config", "../../examples/shop.yaml", "missing.log"},
		{"serve", "--config", "missing.yaml", "--listen", "127.0.0.1:0"},
	} {
		if code, _, errs := runCLI(t, args...); code != 1 || strings.Contains(errs, "sluice: sluice:") || strings.Contains(errs, "rules: ") {
			t.Errorf("sluice %v: exit %d, stderr %q; want 1, and the command's name, not a package's", args, code, errs)
		}
	}
	if _, _, errs := runCLI(t, "check", "missing.yaml"); !strings.HasPrefix(errs, "sluice check: open missing.yaml") {
		t.Errorf("check of a missing file: %q", errs)
	}
}

func TestHelpShowsAnExample(t *testing.T) {
	for _, c := range commands() {
		code, _, errs := runCLI(t, c.name, "--help")
		if code != 0 || !strings.Contains(errs, "Example") {
			t.Errorf("sluice %s --help: exit %d, stderr %q", c.name, code, errs)
		}
	}
}

func TestCheckDescribesGoodFilesAndListsEveryFault(t *testing.T) {
	code, out, errs := runCLI(t, "check", "../../examples/shop.yaml")
	if code != 0 || !strings.Contains(out, "user-default: every request, per user (without it: per ip): at most 20 at once, then 100 per minute") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	code, _, errs = runCLI(t, "check", "../../rules/testdata/bad.yaml")
	if code != 1 || strings.Count(errs, "bad.yaml:") < 8 {
		t.Fatalf("bad file: exit %d, stderr:\n%s", code, errs)
	}
	// Files that are good alone but not together, as serve would load them.
	code, _, errs = runCLI(t, "check", "../../examples/shop.yaml", "../../examples/shop.json")
	if code != 1 || !strings.Contains(errs, "duplicate id") {
		t.Fatalf("a rule id in two files: exit %d, stderr:\n%s", code, errs)
	}
	code, _, errs = runCLI(t, "check", "../../examples/shop.yaml", "../../rules/testdata/extra.yaml")
	if code != 0 {
		t.Fatalf("two files that merge: exit %d, stderr:\n%s", code, errs)
	}
}

func TestReplayAndEstimateFromTheCommandLine(t *testing.T) {
	code, out, errs := runCLI(t, "replay", "--config", "../../examples/shop.yaml", "../../examples/access.log", "--format", "json")
	var rep struct {
		Requests, Malformed int
		Rules               []struct{ Rule string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.Requests != 9 || rep.Malformed != 1 || len(rep.Rules) != 6 {
		t.Fatalf("replay: exit %d, %s\n%s", code, out, errs)
	}
	code, out, errs = runCLI(t, "estimate", "--keys", "1M", "--limit", "100/1m", "--active", "5%")
	if code != 0 || !strings.Contains(out, "50k active keys") || !strings.Contains(out, "sliding-log") {
		t.Fatalf("estimate: exit %d\n%s\n%s", code, out, errs)
	}
	for _, args := range [][]string{{"replay", "x.log"}, {"replay", "--config", "../../examples/shop.yaml", "missing.log"}, {"estimate", "--keys", "x", "--limit", "1/1s"}, {"estimate", "--keys", "1M"}} {
		if code, _, _ := runCLI(t, args...); code == 0 {
			t.Errorf("sluice %v succeeded", args)
		}
	}
}

func TestEstimateMeasuresRedis(t *testing.T) {
	srv := redistest.Start(t)
	code, out, errs := runCLI(t, "estimate", "--keys", "1M", "--limit", "10/1m", "--redis", srv.URL(), "--format", "json")
	var res struct {
		Algorithms []struct {
			Algorithm   string
			RedisPerKey float64 `json:"redisBytesPerKey"`
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Algorithms) != 7 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	// What MEMORY USAGE can report for one key of these shapes: a string or
	// small hash is tens of bytes of value plus the key's name and Redis's
	// object overhead; a full log of 10 holds 10 more entries.
	per := map[string]float64{}
	for _, a := range res.Algorithms {
		per[a.Algorithm] = a.RedisPerKey
		if a.RedisPerKey < 48 || a.RedisPerKey > 256 && a.Algorithm != "sliding-log" {
			t.Errorf("%s: Redis bytes per key %v, want 48 to 256", a.Algorithm, a.RedisPerKey)
		}
	}
	if per["gcra"] > 128 {
		t.Errorf("gcra, one number per key, takes %v B in Redis", per["gcra"])
	}
	if per["sliding-log"] < per["gcra"]+10*8 {
		t.Errorf("a full sliding log of 10 (%v B) is not 10 entries larger than a GCRA key (%v B)", per["sliding-log"], per["gcra"])
	}
	if n, err := srv.Do("DBSIZE"); err != nil || n != ":0" {
		t.Fatalf("estimate left keys behind: %q %v", n, err)
	}
}

// Every flag has a variable, SLUICE_ and its name (--store-timeout-max is
// SLUICE_STORE_TIMEOUT_MAX); the command line overrides it; a bad value is
// named by its variable. Help spells flags --name, with their variables.
func TestEveryFlagHasAVariable(t *testing.T) {
	t.Setenv("SLUICE_FORMAT", "json")
	code, out, errs := runCLI(t, "simulate", "gcra-vs-token-bucket")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Fatalf("SLUICE_FORMAT=json: exit %d, stdout %.80q, stderr %q", code, out, errs)
	}
	code, out, _ = runCLI(t, "simulate", "gcra-vs-token-bucket", "--format", "csv")
	if code != 0 || strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Fatalf("--format csv did not override SLUICE_FORMAT: exit %d, %.80q", code, out)
	}
	t.Setenv("SLUICE_SEED", "seven")
	if code, _, errs := runCLI(t, "simulate", "custom"); code != 2 || !strings.Contains(errs, "$SLUICE_SEED") {
		t.Fatalf("a bad variable: exit %d, stderr %q", code, errs)
	}
	for _, c := range []string{"serve", "gateway"} {
		_, _, help := runCLI(t, c, "--help")
		flags := strings.Count(help, "\n  --")
		if flags < 10 || strings.Count(help, "[$SLUICE_") != flags || strings.Count(help, "\n  -") != flags {
			t.Errorf("sluice %s --help: %d flags, %d variables:\n%s", c, flags, strings.Count(help, "[$SLUICE_"), help)
		}
	}
}

// sluice version names the module version and, from a checkout, the VCS
// revision and its time, and says when the tree had changes.
func TestVersionNamesTheRevision(t *testing.T) {
	info := &debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "6b38424e3f0c9d2a1b7e8f6a5c4d3e2f1a0b9c8d"}, {Key: "vcs.time", Value: "2026-11-30T11:50:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		linked string
		info   *debug.BuildInfo
		want   string
	}{
		{"", info, "v0.4.0 (6b38424e3f0c 2026-11-30T11:50:00Z dirty)"},
		{"v1.0.0", info, "v1.0.0 (6b38424e3f0c 2026-11-30T11:50:00Z dirty)"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "(devel)"},
		{"", nil, "(devel)"},
	} {
		if got := describeBuild(tc.linked, tc.info); got != tc.want {
			t.Errorf("describeBuild(%q, ...) = %q, want %q", tc.linked, got, tc.want)
		}
	}
}

// --log-format json logs one JSON object per line, the refusal of a rule
// file included (with each fault); another format is a mistake, exit 2.
func TestLogFormatJSON(t *testing.T) {
	code, _, errs := runCLI(t, "serve", "--config", "../../rules/testdata/bad.yaml", "--log-format", "json", "--listen", "127.0.0.1:0")
	var line struct {
		Level, Msg string
		Faults     []string
	}
	if code != 1 || json.Unmarshal([]byte(strings.TrimSpace(errs)), &line) != nil || line.Level != "ERROR" || len(line.Faults) < 8 ||
		!strings.HasPrefix(line.Faults[0], "../../rules/testdata/bad.yaml:") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runCLI(t, "serve", "--config", "../../examples/shop.yaml", "--log-format", "xml"); code != 2 || !strings.Contains(errs, "--log-format") {
		t.Fatalf("--log-format xml: exit %d, stderr %q", code, errs)
	}
}

// replay reads a gzipped log as it reads the plain one.
func TestReplayReadsGzippedLogs(t *testing.T) {
	plain, err := os.ReadFile("../../examples/access.log")
	if err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(plain)
	zw.Close()
	gz := filepath.Join(t.TempDir(), "access.log.1.gz")
	os.WriteFile(gz, zipped.Bytes(), 0o600)
	_, want, _ := runCLI(t, "replay", "--config", "../../examples/shop.yaml", "../../examples/access.log", "--format", "json")
	code, got, errs := runCLI(t, "replay", "--config", "../../examples/shop.yaml", gz, "--format", "json")
	if code != 0 || got != want || !strings.Contains(got, `"requests": 9`) {
		t.Fatalf("gzipped: exit %d, %s\n%s\nwant\n%s", code, errs, got, want)
	}
}

// `sluice help COMMAND` is the command's own page, as `COMMAND --help`.
func TestHelpNamesACommandsPage(t *testing.T) {
	code, _, errs := runCLI(t, "help", "replay")
	if code != 0 || !strings.HasPrefix(errs, "Usage: sluice replay") {
		t.Fatalf("sluice help replay: exit %d, %.80q", code, errs)
	}
	if code, _, errs := runCLI(t, "help", "nosuch"); code != 2 || !strings.Contains(errs, `unknown command "nosuch"`) {
		t.Fatalf("sluice help nosuch: exit %d, %.80q", code, errs)
	}
}

// replay takes several --config, as serve does: their rules apply together.
func TestReplayTakesEveryConfig(t *testing.T) {
	extra := filepath.Join(t.TempDir(), "extra.yaml")
	if err := os.WriteFile(extra, []byte("rules:\n  - {id: extra-per-ip, key: [ip], rate: 1, per: 1h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "replay", "--config", "../../examples/shop.yaml", "--config", extra, "--format", "csv", "../../examples/access.log")
	if code != 0 || !strings.Contains(out, "extra-per-ip") || !strings.Contains(out, "ip-flood") {
		t.Fatalf("exit %d: the report names not both files' rules:\n%.400s\n%s", code, out, errs)
	}
}

// sluice test is bounded: a count, a file and the differences listed have
// limits, the clock only goes forward, and an interrupt stops a long run.
func TestRuleTestsAreBounded(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct{ file, want string }{
		{write("count.yaml", "cases:\n  - name: x\n    requests:\n      - {path: /x, count: 1000000000}\n"), "count.yaml:4: count: 1000000000: want 1 to 1000000"},
		{write("negative.yaml", "cases:\n  - name: x\n    requests:\n      - {path: /x, count: -1}\n"), "negative.yaml:4: count: -1"},
		{write("total.yaml", "cases:\n  - name: x\n    requests:\n      - {path: /x, count: 600000}\n      - {path: /x, count: 600000}\n"), "total.yaml:5: more than 1000000 requests"},
		{write("back.yaml", "cases:\n  - name: x\n    requests:\n      - {path: /x, after: -5h}\n"), "back.yaml:4: after: -5h0m0s: the clock only moves forward"},
		{write("large.yaml", "cases:\n  - name: x\n    requests:\n"+strings.Repeat("      - {path: /x}\n", 60000)), "large.yaml: larger than 1 MiB"},
	} {
		if code, _, errs := runCLI(t, "test", "../../examples/shop.yaml", c.file); code != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("exit %d, %q; want 1 and %q", code, errs, c.want)
		}
	}
	// A million differences: twenty listed, the rest counted.
	many := write("many.yaml", "cases:\n  - name: x\n    requests:\n      - {method: POST, path: /otp, attributes: {phone: \"1\"}, count: 100000, expect: {allowed: true}}\n")
	code, out, _ := runCLI(t, "test", "../../examples/shop.yaml", many)
	if code != 1 || strings.Count(out, "allowed: got false") != 20 || !strings.Contains(out, "... and 99977 more differences") {
		t.Errorf("exit %d, %d differences listed:\n%.2000s", code, strings.Count(out, "allowed: got false"), out)
	}
	// An interrupt (SIGTERM cancels run's context) ends the run.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o, e bytes.Buffer
	if code := run(ctx, []string{"test", "../../examples/shop.yaml", many}, &o, &e); code != 1 || !strings.Contains(e.String(), "context canceled") {
		t.Errorf("interrupted: exit %d, %q", code, e.String())
	}
}

// sluice test: the shipped example passes; a wrong expectation fails with
// the request's line, got and want; a misspelt field is refused at its
// line (an expectation nobody checks would pass silently).
func TestRuleTestsPassAndFailByLine(t *testing.T) {
	code, out, errs := runCLI(t, "test", "../../examples/shop.yaml", "../../examples/shop.test.yaml")
	if code != 0 || !strings.Contains(out, "3 of 3 cases passed") {
		t.Fatalf("the example: exit %d\n%s%s", code, out, errs)
	}
	dir := t.TempDir()
	wrong := filepath.Join(dir, "wrong.yaml")
	os.WriteFile(wrong, []byte(`cases:
  - name: otp
    requests:
      - {method: POST, path: /otp, attributes: {phone: "1"}, count: 4, expect: {allowed: true}}
      - {method: POST, path: /otp, attributes: {phone: "1"}, expect: {rule: login, retryAfter: 1s}}
`), 0o600)
	code, out, _ = runCLI(t, "test", "../../examples/shop.yaml", wrong)
	for _, want := range []string{
		"FAIL  otp",
		"wrong.yaml:4: request 1 (4 of 4): allowed: got false, want true",
		"wrong.yaml:5: request 2: rule: got otp-sms, want login",
		"wrong.yaml:5: request 2: retryAfter: got 3m20s, want 1s",
		"0 of 1 case passed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	misspelt := filepath.Join(dir, "misspelt.yaml")
	os.WriteFile(misspelt, []byte("cases:\n  - name: x\n    requests:\n      - {path: /, expect: {alowed: true}}\n"), 0o600)
	if code, _, errs := runCLI(t, "test", "../../examples/shop.yaml", misspelt); code != 1 || !strings.Contains(errs, `misspelt.yaml:4: unknown field "alowed" in expect`) {
		t.Errorf("a misspelt field: exit %d, %s", code, errs)
	}
}

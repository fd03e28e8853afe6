package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

func TestParseCombinedLine(t *testing.T) {
	rec, err := ParseLogLine([]byte(`203.0.113.7 - frank [10/Oct/2000:13:55:36 -0700] "GET /a/b?x=1 HTTP/1.0" 200 2326 "http://ref/" "Mozilla/4.08"`))
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2000, 10, 10, 20, 55, 36, 0, time.UTC)
	if !rec.Time.Equal(want) || rec.Method != "GET" || rec.Path != "/a/b" || rec.RawQuery != "x=1" ||
		rec.IP.String() != "203.0.113.7" || rec.User != "frank" || rec.Status != 200 {
		t.Fatalf("%+v", rec)
	}
	for _, bad := range []string{
		"", "garbage", `203.0.113.7 - - [10/Oct/2000:13:55:36 -0700] "GET /" x`,
		`203.0.113.7 - - [10/Foo/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1`,
		`203.0.113.7 - - [10/Oct/2000:25:55:36 -0700] "GET / HTTP/1.0" 200 1`,
		`not-an-ip - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1`,
		`203.0.113.7 - - [10/Oct/2000:13:55:36 -0700] "\x16\x03\x01" 400 1`,
		`{"time": "yesterday", "path": "/"}`, `{"time": 1.5e9, "path": "no-slash"}`, `{broken`,
	} {
		if _, err := ParseLogLine([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	j, err := ParseLogLine([]byte(`{"time":1764411360.5,"method":"post","path":"/otp?x=1","ip":"::ffff:192.0.2.1","status":201,"headers":{"x-user-id":"u1"}}`))
	if err != nil || j.Method != "POST" || j.Header.Get("X-User-Id") != "u1" || j.IP.String() != "192.0.2.1" || j.Time.UnixMilli() != 1764411360500 {
		t.Fatalf("json line: %+v %v", j, err)
	}
}

// The hand-made log of examples/access.log, replayed through the shop rules.
func TestReplayCountsMatchAHandMadeLog(t *testing.T) {
	cfg, err := rules.Load("../examples/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("../examples/access.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := Replay(f, cfg, ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Lines != 10 || res.Requests != 9 || res.Malformed != 1 || res.FirstBad[0] != 6 {
		t.Fatalf("lines %d, requests %d, malformed %d at %v", res.Lines, res.Requests, res.Malformed, res.FirstBad)
	}
	want := map[string][2]int{ // seen, rejected
		// user-default and tenant count the requests without a user or a
		// tenant too, under the client address (onMissingKey: fallback).
		"ip-flood": {9, 0}, "user-default": {9, 0}, "login": {3, 0}, "otp-sms": {4, 1}, "tenant": {9, 0}, "export": {2, 0},
	}
	for _, rr := range res.Rules {
		if w := want[rr.Rule]; rr.Seen != w[0] || rr.Rejected != w[1] {
			t.Errorf("%s: seen %d, rejected %d; want %v", rr.Rule, rr.Seen, rr.Rejected, w)
		}
	}
	if otp := res.Rules[3]; len(otp.TopKeys) != 1 || otp.TopKeys[0] != (KeyCount{"8801700000000", 1}) {
		t.Fatalf("otp-sms top keys %+v", otp.TopKeys)
	}
	if len(res.PerMinute) != 2 || res.PerMinute[1] != 1 {
		t.Fatalf("per minute %v", res.PerMinute)
	}
	var out bytes.Buffer
	if err := res.Report().Write(&out, "table"); err != nil || !strings.Contains(out.String(), "otp-sms") {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
}

// Out-of-order lines are replayed in timestamp order, and countOn rules are
// charged by the logged status: three failed logins lock, whatever order the
// log wrote them in.
func TestReplaySortsByTimeAndChargesByStatus(t *testing.T) {
	cfg, _ := rules.Parse("r.yaml", []byte("rules:\n  - {id: login, match: {path: /login}, key: [ip], rate: 2, per: 1h, countOn: {status: [401]}}\n"))
	var log bytes.Buffer
	for _, s := range []int{3, 1, 2, 0, 4} { // seconds, out of order
		status := 401
		if s == 0 {
			status = 200
		}
		fmt.Fprintf(&log, "192.0.2.1 - - [29/Nov/2026:10:00:0%d +0000] \"POST /login HTTP/1.1\" %d 1 \"-\" \"-\"\n", s, status)
	}
	res, err := Replay(&log, cfg, ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// t=0 succeeds (not charged); t=1 and t=2 fail and are charged; t=3 and
	// t=4 are refused.
	if rr := res.Rules[0]; rr.Seen != 5 || rr.Rejected != 2 {
		t.Fatalf("login: %+v", rr)
	}
}

func TestReplayRefusesAbsurdLines(t *testing.T) {
	cfg, _ := rules.Parse("r.yaml", []byte("rules:\n  - {id: r, key: [ip], rate: 2, per: 1h}\n"))
	long := strings.Repeat("x", maxLineBytes+10)
	if _, err := Replay(strings.NewReader(long), cfg, ReplayOptions{}); err == nil {
		t.Fatal("a line over the bound was accepted")
	}
}

// BenchmarkReplay reports the replay rate through two rules, in lines per
// second on one goroutine.
func BenchmarkReplay(b *testing.B) {
	cfg, _ := rules.Parse("r.yaml", []byte("rules:\n  - {id: per-ip, key: [ip], rate: 100, per: 1m}\n  - {id: login, match: {method: POST, path: /login}, key: [ip], rate: 10, per: 15m, countOn: {status: [401]}}\n"))
	var log bytes.Buffer
	const lines = 200_000
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for i := range lines {
		t := start.Add(time.Duration(i) * 10 * time.Millisecond)
		method, path, status := "GET", "/items", 200
		if i%10 == 0 {
			method, path, status = "POST", "/login", 401
		}
		fmt.Fprintf(&log, "10.%d.%d.%d - - [%s] \"%s %s HTTP/1.1\" %d 512 \"-\" \"bench\"\n",
			i%7, (i/7)%250, i%250, t.Format("02/Jan/2006:15:04:05 -0700"), method, path, status)
	}
	data := log.Bytes()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Replay(bytes.NewReader(data), cfg, ReplayOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(lines)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// The replay keeps what enforced rules would reject apart from what only a
// shadow rule would, per minute, and its JSON has lists, never null.
func TestReplaySeparatesShadowFromEnforcedAndWritesLists(t *testing.T) {
	cfg, err := rules.Parse("r.yaml", []byte(`
rules:
  - {id: strict, match: {path: /a}, key: [ip], rate: 1, per: 1h}
  - {id: trial, match: {path: /b}, key: [ip], rate: 1, per: 1h, mode: shadow}
  - {id: idle, match: {path: /never}, key: [ip], rate: 1, per: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Join([]string{
		`198.51.100.1 - - [29/Nov/2026:10:15:00 +0000] "GET /a HTTP/1.1" 200 1 "-" "x"`,
		`198.51.100.1 - - [29/Nov/2026:10:15:01 +0000] "GET /a HTTP/1.1" 200 1 "-" "x"`,
		`198.51.100.1 - - [29/Nov/2026:10:15:02 +0000] "GET /a HTTP/1.1" 200 1 "-" "x"`,
		`198.51.100.2 - - [29/Nov/2026:10:16:00 +0000] "GET /b HTTP/1.1" 200 1 "-" "x"`,
		`198.51.100.2 - - [29/Nov/2026:10:16:01 +0000] "GET /b HTTP/1.1" 200 1 "-" "x"`,
	}, "\n")
	res, err := Replay(strings.NewReader(log), cfg, ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.PerMinute, res.ShadowPerMinute) != "[2 0] [0 1]" {
		t.Fatalf("per minute: enforced %v, shadow %v; want [2 0] and [0 1]", res.PerMinute, res.ShadowPerMinute)
	}
	b, _ := json.Marshal(res)
	if strings.Contains(string(b), "null") {
		t.Fatalf("JSON with null: %s", b)
	}
	var buf bytes.Buffer
	res.Report().Write(&buf, "table")
	if !strings.Contains(buf.String(), "2 enforced, 0 shadow") || !strings.Contains(buf.String(), "0 enforced, 1 shadow") || !strings.Contains(buf.String(), "5 requests") {
		t.Fatalf("report:\n%s", buf.String())
	}
}

package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The decision log writes rejections as JSON lines (rule, key hashed unless
// the rule shows keys, reason, retry-after), at most PerSecond a second,
// one in Sample, and says once a second how many it left out.
func TestDecisionLogIsBoundedAndHashesKeys(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	dl := &DecisionLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil)), PerSecond: 3, now: func() time.Time { return clock }}
	f := newFixture(t, `
rules:
  - {id: hidden, match: {path: /h}, key: [user], rate: 1, per: 1h}
  - {id: shown, match: {path: /s}, key: [user], rate: 1, per: 1h, showKeys: true}
`, Options{DecisionLog: dl})
	req := func(path string) {
		r := userReq("u42")
		r.Path = path
		var res Result
		f.e.Check(context.Background(), r, CheckOptions{}, &res)
	}
	for range 10 { // 1 allowed (not logged), 9 rejected: 3 logged, 6 left out
		req("/h")
	}
	clock = clock.Add(time.Second)
	req("/s") // allowed: not logged; the summary waits for a line
	req("/s") // rejected: the summary of the last second, then the line
	type line struct {
		Msg          string `json:"msg"`
		Rule         string `json:"rule"`
		Reason       string `json:"reason"`
		Key          string `json:"key"`
		KeyHash      string `json:"key_hash"`
		RetryAfterMs int64  `json:"retry_after_ms"`
		Suppressed   int    `json:"suppressed"`
	}
	var lines []line
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var x line
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		lines = append(lines, x)
	}
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 3 rejections, a summary and 1 more:\n%s", len(lines), buf.String())
	}
	for _, l := range lines[:3] {
		if l.Rule != "hidden" || l.Reason != "limited" || l.Key != "" || len(l.KeyHash) != 16 || l.RetryAfterMs <= 0 {
			t.Errorf("a hidden rule's rejection: %+v", l)
		}
	}
	if lines[3].Suppressed != 6 {
		t.Errorf("summary %+v, want 6 suppressed", lines[3])
	}
	if l := lines[4]; l.Rule != "shown" || l.Key != "u42" {
		t.Errorf("a showKeys rule's rejection: %+v", l)
	}
	if n := strings.Count(buf.String(), `"u42"`); n != 1 { // the shown rule's line only
		t.Errorf("the key appears %d times: the hidden rule's key leaked: %s", n, buf.String())
	}
}

// A DecisionLog's zero values mean its defaults: every rejection sampled,
// up to 100 lines a second.
func TestDecisionLogDefaults(t *testing.T) {
	var buf bytes.Buffer
	dl := &DecisionLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil))}
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 1, per: 1h}\n", Options{DecisionLog: dl})
	for range 150 {
		var res Result
		f.e.Check(context.Background(), userReq("u"), CheckOptions{}, &res)
	}
	if n := strings.Count(buf.String(), `"msg":"sluice: decision"`); n < 100 || n > 149 {
		t.Fatalf("%d decision lines for 149 rejections, want 100 a second (the default), at least", n)
	}
}

// A check's line says where it came from and, for a face that asks
// (LogPath: gRPC's method), the path; a dry run is never logged, as it
// decides nothing.
func TestDecisionLogLinesSayViaAndPathAndSkipDryRuns(t *testing.T) {
	var buf bytes.Buffer
	dl := &DecisionLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil)), All: true}
	f := newFixture(t, "rules:\n  - {id: r, key: [user], rate: 5, per: 1h}\n", Options{DecisionLog: dl})
	check := func(o CheckOptions) map[string]any {
		buf.Reset()
		var res Result
		if err := f.e.Check(context.Background(), userReq("u"), o, &res); err != nil {
			t.Fatal(err)
		}
		if buf.Len() == 0 {
			return nil
		}
		var line map[string]any
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("%q: %v", buf.String(), err)
		}
		return line
	}
	if l := check(CheckOptions{}); l == nil || l["via"] != "http" || l["method"] != nil {
		t.Errorf("a plain check: %v, want via=http and no method", l)
	}
	if l := check(CheckOptions{Via: "grpc", LogPath: true}); l == nil || l["via"] != "grpc" || l["method"] != "/items" {
		t.Errorf("a check that logs its path: %v, want via=grpc method=/items", l)
	}
	if l := check(CheckOptions{DryRun: true}); l != nil {
		t.Errorf("a dry run was logged: %v", l)
	}
}

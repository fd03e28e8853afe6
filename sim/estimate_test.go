package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The back-of-envelope reference: 10 million users at 64 B of key overhead each is
// 720 MB for GCRA and 8.64 GB for a sliding log of 100 per window.
func TestEstimateReproducesTheReferenceTable(t *testing.T) {
	rep, err := Estimate(EstimateSpec{Keys: 10_000_000, Active: 1, Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Sample: 2000})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]EstimateRow{}
	for _, r := range rep.JSON.(*EstimateResult).Rows {
		rows[r.Algorithm] = r
	}
	if got := rows["gcra"].ReferenceBytes; got != 720_000_000 {
		t.Fatalf("gcra reference %d, want 720 MB", got)
	}
	if got := rows["sliding-log"].ReferenceBytes; got != 8_640_000_000 {
		t.Fatalf("sliding-log reference %d, want 8.64 GB", got)
	}
	// The target is at most 40 B per live GCRA key (one 8-byte word, an
	// 8-byte fingerprint, and the table's slack); the other one-word
	// algorithms share its table layout.
	if m := rows["gcra"].MeasuredPerKey; m < 16 || m > 40 {
		t.Fatalf("gcra measured %.1f B/key, want 16 (its slot) to 40 (the target)", m)
	}
	for _, a := range []string{"token-bucket", "leaky-meter", "leaky-queue"} {
		if m := rows[a].MeasuredPerKey; m < 16 || m > 48 {
			t.Fatalf("%s measured %.1f B/key, want 16 to 48", a, m)
		}
	}
	if m := rows["sliding-log"].MeasuredPerKey; m < 800 {
		t.Fatalf("a full sliding log of 100 measured %.1f B/key, less than its 800 B of timestamps", m)
	}
}

func TestParseCount(t *testing.T) {
	for in, want := range map[string]int64{"10M": 10_000_000, "1.5k": 1500, "250000": 250000, "2G": 2_000_000_000} {
		if got, err := ParseCount(in); err != nil || got != want {
			t.Errorf("ParseCount(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "x", "-5", "0", "1e20"} {
		if _, err := ParseCount(bad); err == nil {
			t.Errorf("ParseCount(%q) accepted", bad)
		}
	}
}

// An estimate beyond the embedded store's per-rule bound says so; within
// it, it warns of nothing (an empty list, not null).
func TestEstimateWarnsBeyondTheKeyBound(t *testing.T) {
	for _, tc := range []struct {
		keys int64
		warn bool
	}{{100_000_000, true}, {1_000_000, false}} {
		rep, err := Estimate(EstimateSpec{Keys: tc.keys, Active: 0.05, Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Sample: 1000})
		if err != nil {
			t.Fatal(err)
		}
		res := rep.JSON.(*EstimateResult)
		if got := len(res.Warnings) > 0; got != tc.warn || res.Warnings == nil {
			t.Errorf("%d keys: warnings %q, want some: %v", tc.keys, res.Warnings, tc.warn)
		}
		if tc.warn && !strings.Contains(strings.Join(rep.Notes, "\n"), "--max-keys") {
			t.Errorf("%d keys: the report does not say what to do: %q", tc.keys, rep.Notes)
		}
	}
}

package sim

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

func TestSharedStoreAdmitsFiveLocalStoresAdmitAll(t *testing.T) {
	rep := ranReport(t, "shared-vs-local")
	res := rep.JSON.(*SharedVsLocalResult)
	for i := range 8 {
		if res.Shared[i] != (i < 5) || !res.Local[i] {
			t.Fatalf("request %d: shared %v, local %v; want shared to admit only the first 5, local all", i, res.Shared[i], res.Local[i])
		}
	}
}

func TestTokenVsLeakyShapesTheBursts(t *testing.T) {
	rep := ranReport(t, "token-vs-leaky")
	res := rep.JSON.(TokenVsLeakyResult)
	total := 0
	for _, s := range res.Seconds {
		total += s.In
		if s.TokenBucket.Allowed+s.TokenBucket.Rejected != s.In || s.LeakyQueue.Allowed+s.LeakyQueue.Rejected != s.In {
			t.Fatalf("second %d does not add up: %+v", s.Second, s)
		}
		if s.LeakyQueue.Sent > 10 {
			t.Fatalf("second %d: the queue sent %d, more than its rate", s.Second, s.LeakyQueue.Sent)
		}
		if s.TokenBucket.Allowed > 20+10 {
			t.Fatalf("second %d: the token bucket allowed %d, over b + r*1s", s.Second, s.TokenBucket.Allowed)
		}
	}
	if total != len(tokenVsLeakyArrivals()) || res.MaxAllowedPerSecond.TokenBucket <= res.MaxAllowedPerSecond.LeakyQueue {
		t.Fatalf("the bucket should pass bursts that the queue smooths: %+v", res.MaxAllowedPerSecond)
	}
	if res.LongestWaitMs <= 0 || res.LongestWaitMs > 2100 {
		t.Fatalf("longest wait %d ms: a queue of 20 at 10/s waits at most ~2 s", res.LongestWaitMs)
	}
}

func TestWindowsShowTheBoundaryEffect(t *testing.T) {
	rep := ranReport(t, "windows")
	a := rep.JSON.(*WindowsResult).Cases[0]
	if a.FixedWindow != [2]int{100, 100} || a.SlidingLog != [2]int{100, 0} {
		t.Fatalf("case A: fixed %v, log %v; want 100+100 (2x at the boundary) and 100+0", a.FixedWindow, a.SlidingLog)
	}
	if a.SlidingWindow[0] != 100 || a.SlidingWindow[1] > 10 {
		t.Fatalf("case A: sliding window %v; want 100 then only a few", a.SlidingWindow)
	}
	b := rep.JSON.(*WindowsResult).Cases[1]
	if b.SlidingLog != [2]int{100, 100} {
		t.Fatalf("case B: the log must admit both bursts 89 s apart: %v", b.SlidingLog)
	}
}

func TestRaceOnlyAtomicMethodsHoldTheLimit(t *testing.T) {
	rep := ranReport(t, "race")
	for _, m := range rep.JSON.(*RaceResult).Methods {
		atomic := m.Method == "sluice" || m.Method == "atomic-incr"
		if atomic && (m.Admitted != 100 || m.OverLimit != 0) {
			t.Fatalf("%s admitted %d, want exactly 100", m.Method, m.Admitted)
		}
		if !atomic && m.Admitted <= 100 {
			t.Fatalf("%s admitted %d: the race should let more than 100 through", m.Method, m.Admitted)
		}
		if m.PerNode["A"]+m.PerNode["B"] != m.Admitted {
			t.Fatalf("%s: per-node counts do not add up: %+v", m.Method, m)
		}
	}
}

// The distributed scenario runs the real share layer: exact and lease never
// admit more than one exact limiter, lease under-admits by at most 2%, local
// admits about N times the limit, and every mode but exact saves calls.
func TestDistributedScenarioShowsEachModesCost(t *testing.T) {
	rep := ranReport(t, "distributed")
	rows := rep.JSON.([]DistributedRow)
	if len(rows) != 48 {
		t.Fatalf("%d rows, want 2 x 2 x 2 x 6", len(rows))
	}
	for _, r := range rows {
		switch r.Mode {
		case "exact", "lease", "auto":
			if r.Admitted > r.Exact {
				t.Errorf("%+v: over the exact answer", r)
			}
		case "local":
			if r.Admitted <= r.Exact*5/4 { // more than the limit: each gateway counts alone
				t.Errorf("%+v: local should admit well over the limit", r)
			}
		}
		if r.Mode == "lease" && r.UnderPercent > 2 {
			t.Errorf("%+v: lease under-admits more than 2%%", r)
		}
		if r.Mode == "lease" && r.CallsPerDecision >= 0.5 {
			t.Errorf("%+v: lease saves too few calls", r)
		}
		if (r.Mode == "split" || r.Mode == "local") && r.CallsPerDecision != 0 {
			t.Errorf("%+v: no store call expected", r)
		}
	}
}

// Every report's columns have names of their own, as CSV readers (and
// spreadsheets) need, and its JSON has lists, never null: every scenario
// and a custom run with one limit twice.
func TestEveryReportHasUniqueColumns(t *testing.T) {
	var reps []*Report
	for _, r := range ranScenarios(t) {
		reps = append(reps, r.rep)
	}
	l := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.TokenBucket}
	rep, err := Custom(&CustomSpec{Seed: 1, Duration: 2 * time.Second, Background: 5, Limits: []sluice.Limit{l, l}})
	if err != nil {
		t.Fatal(err)
	}
	reps = append(reps, rep)
	if len(reps) < 7 {
		t.Fatalf("%d reports: the check below would check little", len(reps))
	}
	for _, rep := range reps {
		if b, _ := json.Marshal(rep.JSON); bytes.Contains(b, []byte("null")) {
			t.Errorf("%s: JSON with null: %s", rep.Title, b)
		}
		for _, row := range rep.Rows {
			for _, cell := range row {
				if strings.Contains(cell, ", ") || strings.Contains(cell, " + ") {
					t.Errorf("%s: a cell holds several values: %q", rep.Title, cell)
				}
			}
		}
		seen := map[string]bool{}
		for _, c := range rep.Columns {
			if seen[c] {
				t.Errorf("%s: column %q twice in %q", rep.Title, c, rep.Columns)
			}
			seen[c] = true
		}
	}
}

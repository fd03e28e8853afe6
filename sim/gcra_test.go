package sim

import (
	"bytes"
	"testing"
)

func TestGCRAVsTokenBucketAgreesOnSpecExample(t *testing.T) {
	rep, err := GCRAVsTokenBucket()
	if err != nil {
		t.Fatal(err)
	}
	res := rep.JSON.(GCRAVsTokenBucketResult)
	if !res.Agree {
		t.Fatalf("algorithms disagree: %+v", res.Requests)
	}
	want := []Outcome{
		{true, 4, 0}, {true, 3, 0}, {true, 2, 0}, {true, 1, 0}, {true, 0, 0},
		{false, 0, 500}, // the sixth at t=0 waits 0.5 s
		{true, 0, 0},    // at 0.5 s one unit is back
		{true, 0, 0},    // and at 1.0 s another
	}
	for i, w := range want {
		if got := res.Requests[i].GCRA; got != w {
			t.Errorf("request %d: %+v, want %+v", i+1, got, w)
		}
	}
}

func TestReportsAreStableAcrossRunsInEveryFormat(t *testing.T) {
	if len(Scenarios()) < 5 || len(Formats) < 3 {
		t.Fatalf("%d scenarios and %d formats: the loop below would check almost nothing", len(Scenarios()), len(Formats))
	}
	for _, r := range ranScenarios(t) {
		if raceBuild && r.Name == "overload" {
			// Half a minute under -race, and no race to find that the first
			// run misses: its text is compared with the docs' quotes on every
			// run (TestQuotedOutputsAreWhatTheCommandsPrint, cmd/sluice, which
			// fails on any change between runs), and run twice here without
			// -race.
			continue
		}
		again, err := r.Run()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range Formats {
			var a, b bytes.Buffer
			if err := r.rep.Write(&a, f); err != nil {
				t.Fatal(err)
			}
			again.Write(&b, f)
			if a.Len() == 0 || !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Fatalf("%s as %s: output empty or differs between runs", r.Name, f)
			}
		}
	}
}

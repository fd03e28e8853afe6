package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The custom scenario with token-vs-leaky's traffic and limits reproduces the
// built-in scenario's numbers: both draw from the same generator in the same
// order, and both run the embedded store.
func TestCustomReproducesTokenVsLeaky(t *testing.T) {
	spec := &CustomSpec{
		Seed: 7, Duration: 10 * time.Second, Background: 6,
		Bursts: []Burst{{2 * time.Second, 35, 200 * time.Millisecond}, {6 * time.Second, 35, 200 * time.Millisecond}},
		Limits: []sluice.Limit{
			{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.TokenBucket},
			{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.LeakyQueue},
		},
	}
	rep, err := Custom(spec)
	if err != nil {
		t.Fatal(err)
	}
	builtin, _ := TokenVsLeaky()
	want := builtin.JSON.(TokenVsLeakyResult)
	for i, s := range rep.JSON.(*CustomResult).Seconds {
		w := want.Seconds[i]
		if s.In != w.In || s.Limits[0].Allowed != w.TokenBucket.Allowed || s.Limits[1].Allowed != w.LeakyQueue.Allowed {
			t.Fatalf("second %d: custom %+v, built-in %+v", i, s, w)
		}
	}
}

func TestCustomFromAFileWithRules(t *testing.T) {
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: per-user, key: [user], rate: 5, per: 1s}\n  - {id: login, match: {path: /login}, key: [user], rate: 1, per: 1m}\n"), 0o600)
	path := filepath.Join(dir, "s.yaml")
	os.WriteFile(path, []byte("seed: 3\nduration: 2s\nbursts:\n  - {at: 0s, size: 12, spread: 0s}\nrules: "+rulesPath+"\n"), 0o600)
	spec, err := LoadCustom(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Custom(spec)
	if err != nil {
		t.Fatal(err)
	}
	tot := rep.JSON.(*CustomResult).Totals
	if tot[0].Allowed != 5 || tot[0].Rejected != 7 {
		t.Fatalf("per-user: %+v, want 5 allowed and 7 rejected of a burst of 12 at one instant", tot[0])
	}
	if tot[1].Allowed+tot[1].Rejected != 0 {
		t.Fatalf("login never applies to GET /: %+v", tot[1])
	}
	// Limits and rules together run side by side, the rules first: each
	// sees the same arrivals.
	os.WriteFile(path, []byte("seed: 3\nduration: 2s\nbursts:\n  - {at: 0s, size: 12, spread: 0s}\nlimits:\n  - {algorithm: sliding-log, rate: 3, per: 1s}\nrules: "+rulesPath+"\n"), 0o600)
	if spec, err = LoadCustom(path); err != nil {
		t.Fatal(err)
	}
	if rep, err = Custom(spec); err != nil {
		t.Fatal(err)
	}
	tot = rep.JSON.(*CustomResult).Totals
	if len(tot) != 3 || tot[0].Name != "per-user" || tot[0].Allowed != 5 || tot[2].Allowed != 3 || tot[2].Rejected != 9 {
		t.Fatalf("limits beside rules: %+v, want per-user 5 of 12, login, then the sliding log 3 of 12", tot)
	}
	// A relative rules path is the scenario file's neighbour, whatever the
	// working directory.
	os.WriteFile(path, []byte("seed: 3\nduration: 2s\nrules: rules.yaml\n"), 0o600)
	if spec, err := LoadCustom(path); err != nil || spec.Rules == nil || len(spec.Rules.Rules) != 2 {
		t.Fatalf("rules: rules.yaml beside the scenario: %v", err)
	}
	if _, err := LoadCustom(filepath.Join(dir, "nope.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
	os.WriteFile(path, []byte("seed: 3\ncolour: red\n"), 0o600)
	if _, err := LoadCustom(path); err == nil {
		t.Fatal("unknown field accepted")
	}
}

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// The gateway runs four Go processors per CPU, counted as the runtime
// counts them for serve (which keeps Go's default), unless GOMAXPROCS is
// set in its environment.
func TestTheGatewayRunsFourProcessorsACPUUnlessGOMAXPROCSIsSet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("rules:\n  - {id: per-ip, key: [ip], rate: 3, per: 1h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	procs := func(env string, gateway bool) float64 {
		t.Helper()
		t.Setenv("GOMAXPROCS", env) // "" is unset, for Go's runtime and for sluice
		var base string
		if gateway {
			admin := freeAddr(t)
			start(t, "gateway", "--config", rulesPath, "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--admin-listen", admin, "--watch", "0")
			base = "http://" + admin
		} else {
			base, _ = startServe(t, "--config", rulesPath)
		}
		n, err := proctest.ReadMetric(base, "go_sched_gomaxprocs_threads")
		if err != nil || n < 1 {
			t.Fatalf("go_sched_gomaxprocs_threads: %v, %v", n, err)
		}
		return n
	}
	cpus := procs("", false)
	if got := procs("", true); got != procsPerCPU*cpus {
		t.Errorf("the gateway runs %v processors; want %d a CPU, %v", got, procsPerCPU, procsPerCPU*cpus)
	}
	if got := procs("3", true); got != 3 {
		t.Errorf("with GOMAXPROCS=3 the gateway runs %v processors; want 3", got)
	}
	// A value the runtime ignores is not a choice made.
	if got := procs("0", true); got != procsPerCPU*cpus {
		t.Errorf("with GOMAXPROCS=0 the gateway runs %v processors; want %v", got, procsPerCPU*cpus)
	}
}

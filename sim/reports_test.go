package sim

import (
	"sync"
	"testing"
)

// ranScenario is a built-in scenario and its report.
type ranScenario struct {
	Scenario
	rep *Report
}

// scenarioRuns runs every built-in scenario once, for the tests that only
// read the reports: a run of them all takes seconds under -race, and each
// test running its own made this package one of the suite's slowest.
var scenarioRuns = sync.OnceValues(func() ([]ranScenario, error) {
	var out []ranScenario
	for _, s := range Scenarios() {
		rep, err := s.Run()
		if err != nil {
			return nil, err
		}
		out = append(out, ranScenario{s, rep})
	}
	return out, nil
})

// ranScenarios is scenarioRuns for a test.
func ranScenarios(t *testing.T) []ranScenario {
	t.Helper()
	runs, err := scenarioRuns()
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// ranReport is the shared run's report of the built-in scenario name.
func ranReport(t *testing.T, name string) *Report {
	t.Helper()
	for _, r := range ranScenarios(t) {
		if r.Name == name {
			return r.rep
		}
	}
	t.Fatalf("no built-in scenario %q", name)
	return nil
}

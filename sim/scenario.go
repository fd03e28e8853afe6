package sim

import (
	"fmt"
	"slices"
	"strings"
)

// Scenario is a built-in simulation.
type Scenario struct {
	Name        string
	Description string
	Run         func() (*Report, error)
}

// Scenarios returns the built-in scenarios, sorted by name.
func Scenarios() []Scenario {
	s := []Scenario{
		{"gcra-vs-token-bucket", "GCRA and a token bucket side by side on r = 2/s, b = 5: they agree", GCRAVsTokenBucket},
		{"token-vs-leaky", "the same traffic through a token bucket and a leaky queue, second by second", TokenVsLeaky},
		{"windows", "fixed window, sliding log and sliding window counter at window boundaries", Windows},
		{"race", "two gateways, one remote counter: non-atomic methods vs atomic ones", Race},
		{"shared-vs-local", "one shared store vs a store per server", SharedVsLocal},
		{"distributed", "gateways x sync mode x balancer skew x store latency: admitted vs exact, store calls, fairness", Distributed},
		{"regions", "one limit over three regions, each on its own store: demand moves twice, one region cut off; admitted by region against the limit", Regions},
		{"overload", "a backend offered 0.5x to 3x its capacity: no limiter, a fixed rate, fixed and adaptive concurrency (AIMD, Gradient2)", Overload},
	}
	slices.SortFunc(s, func(a, b Scenario) int { return strings.Compare(a.Name, b.Name) })
	return s
}

// Lookup returns the built-in scenario with the given name.
func Lookup(name string) (Scenario, error) {
	var names []string
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Scenario{}, fmt.Errorf("sim: unknown scenario %q (want one of %s)", name, strings.Join(names, ", "))
}

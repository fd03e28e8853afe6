package rules_test

import (
	"fmt"

	"github.com/sluice-rl/sluice/rules"
)

// Parse reads a rule file (YAML or JSON) and checks every field.
func ExampleParse() {
	cfg, err := rules.Parse("rules.yaml", []byte(`
rules:
  - id: per-user
    key: [user]
    rate: 100
    per: 1m
  - id: login
    match: {method: POST, path: /login}
    key: [user, ip]
    rate: 10
    per: 15m
    algorithm: sliding-log
`))
	if err != nil {
		panic(err)
	}
	for _, r := range cfg.Rules {
		fmt.Println(r.ID, r.Limit)
	}
	// Output:
	// per-user 100/1m gcra
	// login 10/15m sliding-log
}

// A file with mistakes is refused, each one named by file, line, column
// and field; a server that reloads keeps its old rules.
func ExampleParse_invalid() {
	_, err := rules.Parse("rules.yaml", []byte(`
rules:
  - id: per-user
    key: [user]
    rate: -5
    per: 1m
    algorithm: gcra2
`))
	fmt.Println(err)
	// Output:
	// rules.yaml:5:11: rules[0].rate: must be > 0, got -5
	// rules.yaml:7:16: rules[0].algorithm: unknown algorithm "gcra2" (want one of gcra, token-bucket, leaky-meter, leaky-queue, fixed-window, sliding-log, sliding-window)
}

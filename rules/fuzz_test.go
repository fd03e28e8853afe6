package rules

import (
	"os"
	"path/filepath"
	"testing"
)

// The rule-file parser takes YAML, JSON and envoyproxy/ratelimit's format.
// Whatever the bytes, it returns a config or errors, never panics, and every
// rule it accepts has a limit that validates. Run longer with
// go test ./rules -run '^$' -fuzz FuzzParse -fuzztime 60s.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../examples/*.yaml")
	more, _ := filepath.Glob("../examples/*.json")
	envoy, _ := filepath.Glob("../examples/envoy/*.yaml")
	for _, p := range append(append(files, more...), envoy...) {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"rules: [{id: a, key: [ip], rate: 1, per: 1s}]",
		`{"rules":[{"id":"a","key":["user"],"rate":9223372036854775807,"per":"1ns"}]}`,
		"domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 0}}]",
		"paths: {trailingSlash: keep, caseInsensitive: true}\nrules: [{id: a, match: {path: /A/}, key: [ip], rate: 1, per: 1s}]",
		"rules: [{id: a, key: [ip], rate: 1, per: 1s, cost: 2}]",
		"rules:\n  - &a {id: a, key: [ip], rate: 1, per: 1s}\n  - *a\n",
		"\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		for _, r := range c.Rules {
			if err := r.Limit.Validate(); err != nil {
				t.Fatalf("rule %q accepted with an invalid limit: %v", r.ID, err)
			}
		}
	})
}

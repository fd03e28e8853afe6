package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

func TestEnvoyFileLoadsAsIs(t *testing.T) {
	c, err := Load("../examples/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*Rule{}
	for _, r := range c.Rules {
		byID[r.ID] = r
		if r.Envoy == nil || r.Envoy.Domain != "edge" {
			t.Fatalf("%s: not an Envoy rule of domain edge: %+v", r.ID, r.Envoy)
		}
	}
	login := byID["edge.login"]
	if login == nil || login.Limit != (sluice.Limit{Rate: 5, Period: time.Minute, Algorithm: sluice.FixedWindow}) ||
		len(login.Envoy.Entries) != 2 || login.Envoy.Entries[1] != (EnvoyEntry{Key: "path", Value: "/login"}) {
		t.Fatalf("login: %+v", login)
	}
	if r := byID["edge.api_key.path__export__"]; r == nil || !r.Shadow || r.Limit.Period != time.Hour {
		t.Fatalf("shadow export rule: %+v", r)
	}
	if r := byID["edge.source_internal"]; r == nil || !r.Envoy.Unlimited {
		t.Fatalf("unlimited rule: %+v", r)
	}
	if c.NeedsBody() {
		t.Fatal("Envoy rules never read bodies")
	}
	if got := login.Summary(); !strings.Contains(got, "envoy domain edge api_key=(each value) path=/login") {
		t.Fatalf("summary %q", got)
	}
}

func TestEnvoyFileFaults(t *testing.T) {
	for name, src := range map[string]string{
		"no domain":     "descriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n",
		"bad unit":      "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}\n",
		"negative rate": "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: -1}}\n",
		"no key":        "domain: d\ndescriptors:\n  - {value: a, rate_limit: {unit: second, requests_per_unit: 1}}\n",
		"unknown":       "domain: d\ndescriptors:\n  - {key: a, colour: red}\n",
		"not a list":    "domain: d\ndescriptors: {key: a}\n",
		"bad replaces":  "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: x}}\n",
	} {
		if _, err := Parse(name+".yaml", []byte(src)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEnvoyIDsAreValidAndUnique(t *testing.T) {
	c, err := Parse("ids.yaml", []byte(`domain: "my domain"
descriptors:
  - key: path
    value: "/a b"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/a?b"
    rate_limit: {unit: second, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Rules[0].ID == c.Rules[1].ID || !validID(c.Rules[0].ID) || !validID(c.Rules[1].ID) {
		t.Fatalf("ids %q and %q", c.Rules[0].ID, c.Rules[1].ID)
	}
}

func TestSluiceRulesCanAnswerDescriptors(t *testing.T) {
	c, err := Parse("s.yaml", []byte(`rules:
  - id: per-path
    envoy: {domain: edge, descriptors: [{key: path, value: "/api/*"}]}
    rate: 10
    per: 1s
    algorithm: gcra
`))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.Envoy == nil || r.Envoy.Entries[0].Matches("/api/x") != 2 || r.Envoy.Entries[0].Matches("/other") != 0 {
		t.Fatalf("%+v", r.Envoy)
	}
	if _, err := Parse("s.yaml", []byte("rules:\n  - {id: x, envoy: {domain: edge}, rate: 1, per: 1s}\n")); err == nil {
		t.Fatal("an envoy match without entries was accepted")
	}
	// Usage reports are charged beyond the limit; a sliding log cannot hold
	// that debt, so a spent token budget would never be refused.
	_, err = Parse("s.yaml", []byte("rules:\n  - {id: x, envoy: {domain: edge, descriptors: [{key: user}]}, rate: 2, per: 1h, algorithm: sliding-log}\n"))
	if err == nil || !strings.Contains(err.Error(), "rules[0].algorithm") {
		t.Fatalf("Envoy descriptors on a sliding-log rule: %v, want refused at rules[0].algorithm", err)
	}
	if (EnvoyEntry{Key: "k"}).Matches("anything") != 1 || (EnvoyEntry{Key: "k", Value: "v"}).Matches("v") != 3 {
		t.Fatal("match specificity")
	}
}

// What the reference service refuses is refused, at the offending field:
// file:line:column of the second duplicate key, of the self-replacing name,
// of the unit of an unlimited limit.
func TestEnvoyFileRefusesWhatTheReferenceRefuses(t *testing.T) {
	for _, tc := range []struct{ name, src, at string }{
		{"duplicate key", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n", "dup.yaml:6:10: descriptors[1].key"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n", "dup.yaml:7:17: descriptors[0].rate_limit.replaces[0].name"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n", "dup.yaml:6:13: descriptors[0].rate_limit.unit"},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true, rate_limit: {unit: second, requests_per_unit: 1}}\n", "descriptors[0].share_threshold"},
	} {
		_, err := Parse("dup.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.at) {
			t.Errorf("%s: %v, want an error at %s", tc.name, err, tc.at)
		}
	}
	// And what it accepts is accepted: a domain with null descriptors, a
	// zero rate (always over the limit), metadata, quota_mode.
	for _, src := range []string{
		"domain: d\ndescriptors:\n",
		"domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 0}}\n",
		"domain: d\ndescriptors:\n  - {key: k, quota_mode: true, metadata: {service: {name: s1}}, rate_limit: {unit: minute, requests_per_unit: 3}}\n",
	} {
		if _, err := Parse("ok.yaml", []byte(src)); err != nil {
			t.Errorf("%q: %v", src, err)
		}
	}
}

// Wildcards anywhere in a value, each * matching any run, empty included.
func TestEnvoyWildcardsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		match          bool
	}{
		{"foo*", "foo1", true}, {"foo*", "bar", false}, {"bar*b", "barab", true}, {"bar*b", "barb", true},
		{"bar*b", "bara", false}, {"bar*b", "xbarb", false}, {"foo*bar*baz", "foo123bar456baz", true},
		{"foo*bar*baz", "foobarbaz", true}, {"foo*bar*baz", "foo123baz", false}, {"/api/*/action", "/api/v1/action", true},
		{"/api/*/action", "/api/v1/other", false}, {"*", "", true}, {"a*a", "a", false},
	} {
		if got := (EnvoyEntry{Key: "k", Value: tc.pattern}).Matches(tc.value) > 0; got != tc.match {
			t.Errorf("%q matches %q = %v, want %v", tc.pattern, tc.value, got, tc.match)
		}
	}
}

// Two files declaring one domain are refused, at the second file's domain
// line, as the reference refuses them; with MergeDomains (its
// MERGE_DOMAIN_CONFIG=true) their descriptors merge, and a limit name in
// both is still one id too many.
func TestOneDomainOneFileUnlessMerged(t *testing.T) {
	a, err := Parse("a.yaml", []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse("b.yaml", []byte("# the login team's\ndomain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 9}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Merge(a, b)
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || es[0].File != "b.yaml" || es[0].Line != 2 || es[0].Field != "domain" || !strings.Contains(es[0].Msg, "a.yaml") {
		t.Fatalf("two files for domain edge: %v, want one fault at b.yaml:2 field domain naming a.yaml", err)
	}
	c, err := LoadOptions{MergeDomains: true}.Merge(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules) != 2 || len(c.EnvoyDomains) != 1 {
		t.Fatalf("merged: %d rules, domains %v; want both descriptors in one domain", len(c.Rules), c.EnvoyDomains)
	}
	other, _ := Parse("c.yaml", []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if _, err := (LoadOptions{MergeDomains: true}).Merge(a, other); err == nil || !strings.Contains(err.Error(), "duplicate id") {
		t.Fatalf("one descriptor in two merged files: %v, want a duplicate id", err)
	}
}

// Descriptors nested deeper than MaxEnvoyDepth are refused at their field.
func TestEnvoyDescriptorsNestAtMost64Deep(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	indent := ""
	for i := range MaxEnvoyDepth + 1 {
		fmt.Fprintf(&b, "%s  - key: k%d\n%s    descriptors:\n", indent, i, indent)
		indent += "    "
	}
	fmt.Fprintf(&b, "%s  - key: leaf\n%s    rate_limit: {unit: second, requests_per_unit: 1}\n", indent, indent)
	_, err := Parse("deep.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "nested deeper than 64") {
		t.Fatalf("65 levels: %v", err)
	}
}

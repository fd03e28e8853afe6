package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// A rule test file is a list of cases; each case is a sequence of requests
// and the decisions expected, run against the rules on a fresh embedded
// store whose clock moves only when a request says "after".
type ruleTestFile struct {
	Cases []ruleTestCase `yaml:"cases"`
}

type ruleTestCase struct {
	Name     string            `yaml:"name"`
	Requests []ruleTestRequest `yaml:"requests"`
}

type ruleTestRequest struct {
	After      time.Duration     `yaml:"after"` // the clock moves this much first
	Count      int               `yaml:"count"` // the request is sent this many times (default 1), each expected to answer as said
	Method     string            `yaml:"method"`
	Path       string            `yaml:"path"`
	Host       string            `yaml:"host"`
	IP         string            `yaml:"ip"`
	Headers    map[string]string `yaml:"headers"`
	Attributes map[string]string `yaml:"attributes"`
	Cost       int64             `yaml:"cost"`
	Expect     ruleTestExpect    `yaml:"expect"`
	line       int
}

type ruleTestExpect struct {
	Allowed    *bool          `yaml:"allowed"`
	Rule       *string        `yaml:"rule"`
	Reason     *string        `yaml:"reason"`
	Remaining  *int64         `yaml:"remaining"`
	RetryAfter *time.Duration `yaml:"retryAfter"`
}

// A test file is read whole and its requests run in one process: these
// bound what one file can ask of it.
const (
	maxRuleTestBytes    = 1 << 20   // a test file's size (some 30,000 requests; count: repeats one)
	maxRuleTestRequests = 1_000_000 // the requests of a file, counts included
	maxCaseDifferences  = 20        // the differences listed per case; the rest are counted
)

var ruleTestFields = map[string][]string{
	"file":    {"cases"},
	"case":    {"name", "requests"},
	"request": {"after", "count", "method", "path", "host", "ip", "headers", "attributes", "cost", "expect"},
	"expect":  {"allowed", "rule", "reason", "remaining", "retryAfter"},
}

func runTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice test RULES CASES")
		fmt.Fprintln(stderr, "\nRuns the requests of a test file (CASES, YAML) through the rule file RULES on")
		fmt.Fprintln(stderr, "the embedded store and a clock that moves only when a request says after:,")
		fmt.Fprintln(stderr, "and compares each decision with the one expected: allowed, rule, reason,")
		fmt.Fprintln(stderr, "remaining, retryAfter. Prints each case's result and each difference with")
		fmt.Fprintln(stderr, "the file's line; exits 1 if any case fails. For CI, as promtool test rules")
		fmt.Fprintln(stderr, "tests alerting rules. The format: docs/rules.md, \"Testing rules\".")
		fmt.Fprintln(stderr, "\nExample:\n  sluice test examples/shop.yaml examples/shop.test.yaml")
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) != 2 {
		return errUsage{errors.New("want a rule file and a test file")}
	}
	cfg, err := rules.Load(positional[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errExit{1}
	}
	cases, err := loadRuleTests(positional[1])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errExit{1}
	}
	failed := 0
	for _, c := range cases {
		diffs, err := runRuleCase(ctx, cfg, c, positional[1])
		if err != nil {
			return err
		}
		if len(diffs) == 0 {
			fmt.Fprintf(stdout, "ok    %s\n", c.Name)
			continue
		}
		failed++
		fmt.Fprintf(stdout, "FAIL  %s\n", c.Name)
		for _, d := range diffs {
			fmt.Fprintf(stdout, "      %s\n", d)
		}
	}
	fmt.Fprintf(stdout, "%d of %s passed\n", len(cases)-failed, plural(len(cases), "case"))
	if failed > 0 {
		return errExit{1}
	}
	return nil
}

// loadRuleTests reads a test file, refusing unknown fields with their line.
func loadRuleTests(path string) ([]ruleTestCase, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRuleTestBytes+1))
	f.Close()
	if err != nil {
		return nil, err
	}
	if len(data) > maxRuleTestBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB; split it", path, maxRuleTestBytes>>20)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: empty; want a mapping with a cases list", path)
	}
	if err := knownFields(path, doc.Content[0], "file"); err != nil {
		return nil, err
	}
	var file ruleTestFile
	if err := doc.Content[0].Decode(&file); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(file.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", path)
	}
	// The lines of the requests, for the differences.
	for _, kv := range yamlPairs(doc.Content[0]) {
		if kv[0].Value != "cases" {
			continue
		}
		for i, cn := range kv[1].Content {
			for _, ckv := range yamlPairs(cn) {
				if ckv[0].Value == "requests" {
					for j, rn := range ckv[1].Content {
						if j < len(file.Cases[i].Requests) {
							file.Cases[i].Requests[j].line = rn.Line
						}
					}
				}
			}
		}
	}
	total := 0
	for _, c := range file.Cases {
		for _, r := range c.Requests {
			switch {
			case r.Count < 0 || r.Count > maxRuleTestRequests:
				return nil, fmt.Errorf("%s:%d: count: %d: want 1 to %d (0 or none: 1)", path, r.line, r.Count, maxRuleTestRequests)
			case r.After < 0:
				return nil, fmt.Errorf("%s:%d: after: %v: the clock only moves forward", path, r.line, r.After)
			}
			if total += max(r.Count, 1); total > maxRuleTestRequests {
				return nil, fmt.Errorf("%s:%d: more than %d requests in the file, counts included; split it", path, r.line, maxRuleTestRequests)
			}
		}
	}
	return file.Cases, nil
}

// yamlPairs are a mapping node's key and value nodes.
func yamlPairs(n *yaml.Node) [][2]*yaml.Node {
	var out [][2]*yaml.Node
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		out = append(out, [2]*yaml.Node{n.Content[i], n.Content[i+1]})
	}
	return out
}

// knownFields refuses a field the format does not have, at its line: a
// misspelt expectation would otherwise pass unchecked.
func knownFields(path string, n *yaml.Node, kind string) error {
	for _, kv := range yamlPairs(n) {
		if !slices.Contains(ruleTestFields[kind], kv[0].Value) {
			return fmt.Errorf("%s:%d: unknown field %q in %s (known: %s)", path, kv[0].Line, kv[0].Value, kind, strings.Join(ruleTestFields[kind], ", "))
		}
		switch {
		case kind == "file" && kv[0].Value == "cases":
			for _, c := range kv[1].Content {
				if err := knownFields(path, c, "case"); err != nil {
					return err
				}
			}
		case kind == "case" && kv[0].Value == "requests":
			for _, r := range kv[1].Content {
				if err := knownFields(path, r, "request"); err != nil {
					return err
				}
			}
		case kind == "request" && kv[0].Value == "expect":
			if err := knownFields(path, kv[1], "expect"); err != nil {
				return err
			}
		}
	}
	return nil
}

// runRuleCase runs one case on a fresh store and returns its differences:
// the first maxCaseDifferences, and a line counting the others. It stops
// when ctx ends (an interrupt).
func runRuleCase(ctx context.Context, cfg *rules.Config, c ruleTestCase, path string) ([]string, error) {
	clock := sluice.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock))})
	if err != nil {
		return nil, err
	}
	var diffs []string
	more := 0
	for i, r := range c.Requests {
		clock.Advance(r.After)
		req := rules.Request{Method: strings.ToUpper(r.Method), Host: r.Host, Path: r.Path, Header: http.Header{}, Attributes: map[string]string{}}
		if req.Method == "" {
			req.Method = http.MethodGet
		}
		if req.Path == "" {
			req.Path = "/"
		}
		if p, q, ok := strings.Cut(req.Path, "?"); ok {
			req.Path, req.RawQuery = p, q
		}
		if r.IP != "" {
			a, err := netip.ParseAddr(r.IP)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: ip %q: %v", path, r.line, r.IP, err)
			}
			req.ClientIP = a
		}
		for k, v := range r.Headers {
			req.Header.Add(k, v)
		}
		for k, v := range r.Attributes {
			req.Attributes[rules.AttributeName(k)] = v
		}
		opt := engine.CheckOptions{Cost: r.Cost}
		var res engine.Result
		for n := range max(r.Count, 1) {
			if n%1024 == 0 && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if err := e.Check(ctx, &req, opt, &res); err != nil {
				return nil, fmt.Errorf("%s:%d: %v", path, r.line, err)
			}
			d := compareDecision("", r.Expect, &res)
			if len(d) > 0 { // again, saying where: most requests answer as expected
				where := fmt.Sprintf("%s:%d: request %d", path, r.line, i+1)
				if r.Count > 1 {
					where += fmt.Sprintf(" (%d of %d)", n+1, r.Count)
				}
				d = compareDecision(where, r.Expect, &res)
			}
			keep := min(len(d), maxCaseDifferences-len(diffs))
			diffs, more = append(diffs, d[:keep]...), more+len(d)-keep
		}
	}
	if more > 0 {
		diffs = append(diffs, fmt.Sprintf("... and %d more differences", more))
	}
	return diffs, nil
}

func compareDecision(where string, x ruleTestExpect, res *engine.Result) []string {
	var out []string
	d := &res.Decision
	diff := func(field string, got, want any) {
		out = append(out, fmt.Sprintf("%s: %s: got %v, want %v", where, field, got, want))
	}
	if x.Allowed != nil && res.Allowed != *x.Allowed {
		diff("allowed", res.Allowed, *x.Allowed)
	}
	if x.Rule != nil && d.Rule != *x.Rule {
		diff("rule", d.Rule, *x.Rule)
	}
	if x.Reason != nil && res.Reason.String() != *x.Reason {
		diff("reason", res.Reason, *x.Reason)
	}
	if x.Remaining != nil && d.Remaining != *x.Remaining {
		diff("remaining", d.Remaining, *x.Remaining)
	}
	if x.RetryAfter != nil && d.RetryAfter != *x.RetryAfter {
		diff("retryAfter", d.RetryAfter, *x.RetryAfter)
	}
	return out
}

package rules

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files from the code")

// Every rule example in docs/rules.md loads, and is described as
// testdata/docs-rules.golden says: what `sluice check`, /v1/rules and the
// live page print for it (a rule with regions as a gateway of the first
// region describes it). A change to a description shows as a diff of the
// golden file; `go test ./rules -run DocExamples -update` rewrites it once
// the new words are right.
func TestDocExamplesAreDescribedAsGolden(t *testing.T) {
	blocks := yamlBlocks(t, "../docs/rules.md")
	var got strings.Builder
	described := 0
	for _, b := range blocks {
		src := b.text
		if !strings.Contains(src, "rules:") {
			if !strings.HasPrefix(strings.TrimSpace(src), "- ") {
				continue // not a rule file or a rule (a test cases file)
			}
			src = "rules:\n" + src
		}
		cfg, err := Parse(fmt.Sprintf("docs/rules.md:%d", b.line), []byte(src))
		if err != nil {
			t.Errorf("docs/rules.md:%d: the example does not load: %v", b.line, err)
			continue
		}
		fmt.Fprintf(&got, "docs/rules.md:%d\n", b.line)
		for _, r := range cfg.Rules {
			region := "" // the first region by name
			for name := range r.Regions {
				if region == "" || name < region {
					region = name
				}
			}
			fmt.Fprintf(&got, "  %s\n", r.SummaryIn(region))
			described++
		}
	}
	if described < 10 {
		t.Fatalf("%d rules described: the parser misses the examples", described)
	}
	const golden = "testdata/docs-rules.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (write it with -update)", err)
	}
	if got.String() != string(want) {
		t.Errorf("the descriptions of docs/rules.md's examples changed (-update rewrites %s):\n%s", golden, lineDiff(string(want), got.String()))
	}
}

type yamlBlock struct {
	line int // of the block's first line
	text string
}

// yamlBlocks returns the ```yaml blocks of a Markdown file.
func yamlBlocks(t *testing.T, path string) []yamlBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []yamlBlock
	var cur *yamlBlock
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && line == "```yaml":
			cur = &yamlBlock{line: n + 1}
		case cur != nil && strings.HasPrefix(line, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	return out
}

// lineDiff shows the lines of want and got that differ, in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d\n- %s\n+ %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}

package main

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// The outputs the docs quote are what the commands print: each block of
// docs/simulator.md that starts with "$ sluice ..." is run, and the block
// must be its output, line for line (trailing spaces aside). The
// deterministic commands only: estimate's measured columns vary from run
// to run, so of its block only the first line is held. A doc may abridge:
// a line "..." stands for any number of lines (at the end, for the rest),
// and a line ending in "...)" for any line that starts as it does.
func TestQuotedOutputsAreWhatTheCommandsPrint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every simulation")
	}
	runs := 0
	printed := map[string]string{} // by command: two docs quote the overload run
	for _, doc := range []string{"../../docs/simulator.md", "../../README.md", "../../docs/service.md", "../../docs/adaptive.md", "../../docs/rules.md"} {
		for _, b := range quotedRuns(t, doc) {
			runs++
			args := strings.Fields(strings.TrimPrefix(b.command, "$ sluice "))
			key := strings.Join(args, " ")
			if _, ok := printed[key]; !ok {
				_, out, errs := proctest.RunFrom(t, "../..", args...) // from the repository's root, as the docs run it; a terminal shows both streams
				printed[key] = out + errs
			}
			got := trimLines(printed[key])
			want := b.output
			if args[0] == "estimate" { // measured: the first line only
				got, want = got[:min(1, len(got))], want[:min(1, len(want))]
			}
			if !abridged(got, want) {
				t.Errorf("%s:%d: %s prints\n%s\nbut the doc quotes\n%s", doc, b.line, b.command, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	}
	if runs < 10 { // 8 in docs/simulator.md, 2 in docs/rules.md
		t.Fatalf("%d quoted runs found: the parser misses blocks", runs)
	}
}

type quotedRun struct {
	command string
	line    int
	output  []string
}

// quotedRuns finds the fenced blocks whose first line is "$ sluice ...".
func quotedRuns(t *testing.T, path string) []quotedRun {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []quotedRun
	var cur *quotedRun
	inBlock, first := false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			if inBlock && cur != nil {
				cur.output = trimLines(strings.Join(cur.output, "\n"))
				out = append(out, *cur)
			}
			inBlock, first, cur = !inBlock, true, nil
			continue
		}
		if !inBlock {
			continue
		}
		if first {
			first = false
			if strings.HasPrefix(line, "$ sluice ") {
				cur = &quotedRun{command: line, line: n}
			}
			continue
		}
		if cur != nil {
			cur.output = append(cur.output, line)
		}
	}
	return out
}

// trimLines splits s into lines without trailing spaces or trailing empty
// lines.
func trimLines(s string) []string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// abridged reports whether want quotes got, abridged as the test's doc
// comment says.
func abridged(got, want []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "..." { // any number of lines, then the rest of want
		for k := 0; k <= len(got); k++ {
			if abridged(got[k:], want[1:]) {
				return true
			}
		}
		return false
	}
	if len(got) == 0 {
		return false
	}
	if head, ok := strings.CutSuffix(want[0], "...)"); ok {
		if !strings.HasPrefix(got[0], head) {
			return false
		}
	} else if got[0] != want[0] {
		return false
	}
	return abridged(got[1:], want[1:])
}

func TestAbridgedQuotes(t *testing.T) {
	got := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		want []string
		ok   bool
	}{
		{[]string{"a", "b", "c", "d"}, true},
		{[]string{"a", "..."}, true},
		{[]string{"a", "...", "d"}, true},
		{[]string{"...", "c", "..."}, true},
		{[]string{"a", "...", "c"}, false}, // c is not the last line
		{[]string{"a", "b...)", "c", "d"}, true},
		{[]string{"a", "x...)", "c", "d"}, false},
		{[]string{"a", "b", "c"}, false},
		{[]string{"a", "b", "c", "d", "e"}, false},
		{[]string{"...", "e"}, false},
	} {
		if abridged(got, c.want) != c.ok {
			t.Errorf("abridged(%q, %q) = %v", got, c.want, !c.ok)
		}
	}
}

// CI runs the README's own test command, so that a newcomer's command is
// the one that is kept green.
func TestCIRunsTheReadmesTestCommand(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var command string
	for _, line := range strings.Split(string(readme), "\n") {
		if before, _, ok := strings.Cut(line, "# run the tests"); ok {
			command = strings.TrimSpace(before)
			break
		}
	}
	if !strings.HasPrefix(command, "go test ") {
		t.Fatalf("the README's top names no test command (a line ending in \"# run the tests\"): %q", command)
	}
	if !slices.Contains(strings.Split(string(ci), "\n"), command) {
		t.Fatalf(".ci/run does not run the README's test command %q", command)
	}
}

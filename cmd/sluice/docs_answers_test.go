package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The answers the docs quote are what the built `sluice serve` answers:
// each `curl -s` in a shell block of README.md and docs/service.md is sent
// to a fresh server on the rule file the doc names before it
// (examples/shop.yaml unless "serve --config FILE" comes first), and the
// answer must match the quote that follows it: comment lines starting
// "# {" in the same block, or the JSON block right after it. A quote may
// abridge with "...", and values that depend on the moment (retryAfterMs,
// resetAfterMs, Retry-After, a reservation's id and deadline) match any
// value. A comment "# the fourth such request" repeats the last request up
// to that count; an id abridged in a request body ("AYvPbInu...") stands
// for the id of the last answer.
func TestQuotedAnswersAreWhatTheServiceAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	checked := 0
	for _, doc := range []string{"../../README.md", "../../docs/service.md"} {
		for _, b := range quotedCurls(t, doc) {
			base, _ := startServe(t, "--config", "../../"+b.config)
			var lastBody, lastID string
			sent := map[string]int{}
			for _, step := range b.steps {
				body := step.body
				if n := step.repeatTo; n > 0 {
					for sent[lastKey(step)] < n-1 {
						post(t, base, step.path, lastBody)
						sent[lastKey(step)]++
					}
				}
				if lastID != "" {
					body = abridgedID.ReplaceAllString(body, `"id":"`+lastID+`"`)
				}
				answer := post(t, base, step.path, body)
				sent[lastKey(step)]++
				lastBody = body
				if m := answerID.FindStringSubmatch(answer); m != nil {
					lastID = m[1]
				}
				if step.quote == "" {
					continue
				}
				checked++
				if !quoteMatches(step.quote, answer) {
					t.Errorf("%s:%d: %s %s answers\n%s\nbut the doc quotes\n%s", doc, step.line, step.path, body, answer, step.quote)
				}
			}
		}
	}
	if checked < 6 {
		t.Fatalf("%d quoted answers found: the parser misses some", checked)
	}
}

var (
	abridgedID = regexp.MustCompile(`"id":"[A-Za-z0-9_-]+\.\.\."`)
	answerID   = regexp.MustCompile(`"id":"([A-Za-z0-9_-]+)"`)
	// Values that change with the moment a request is sent.
	momentary = regexp.MustCompile(`("(?:retryAfterMs|resetAfterMs)":)\d+|("Retry-After":")\d+|("(?:deadline|id)":")[^"]*`)
	curlLine  = regexp.MustCompile(`^curl -s (?:-d '([^']*)' *)?(?:\\\s*)?http://127\.0\.0\.1:8080(/\S*)`)
	ordinals  = map[string]int{"second": 2, "third": 3, "fourth": 4, "fifth": 5}
)

type curlStep struct {
	line     int
	path     string
	body     string
	quote    string
	repeatTo int // send the previous request again up to this count first
}

type curlBlock struct {
	config string
	steps  []curlStep
}

func lastKey(s curlStep) string { return s.path }

// quotedCurls reads the curl commands of a doc's shell blocks and the
// answers it quotes for them.
func quotedCurls(t *testing.T, path string) []curlBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	config := "examples/shop.yaml"
	serveConfig := regexp.MustCompile(`serve --config (\S+?)[` + "`" + `\s]`)
	var blocks []curlBlock
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if !strings.HasPrefix(line, "```") {
			if m := serveConfig.FindStringSubmatch(line + " "); m != nil {
				config = m[1]
			}
			continue
		}
		// A fenced block: its lines, with continuations joined.
		lang := strings.TrimPrefix(line, "```")
		var body []string
		var at []int
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			l := lines[i]
			if n := len(body); n > 0 && strings.HasSuffix(body[n-1], "\\") {
				body[n-1] = strings.TrimSuffix(body[n-1], "\\") + strings.TrimSpace(l)
				continue
			}
			if n := len(body); n > 0 && strings.HasPrefix(l, "#  ") && strings.HasPrefix(body[n-1], "# {") {
				body[n-1] += strings.TrimSpace(strings.TrimPrefix(l, "#"))
				continue
			}
			body = append(body, l)
			at = append(at, i+1)
		}
		if lang != "sh" {
			continue
		}
		var b curlBlock
		repeat := 0
		for j, l := range body {
			switch {
			case strings.HasPrefix(l, "curl ") && !strings.Contains(l, "|"):
				m := curlLine.FindStringSubmatch(l)
				if m == nil {
					t.Fatalf("%s:%d: a curl the test cannot read: %s", path, at[j], l)
				}
				b.steps = append(b.steps, curlStep{line: at[j], path: m[2], body: m[1], repeatTo: repeat})
				repeat = 0
			case strings.HasPrefix(l, "# {") && len(b.steps) > 0:
				s := &b.steps[len(b.steps)-1]
				if s.quote != "" { // another answer: the same request again
					b.steps = append(b.steps, curlStep{line: at[j], path: s.path, body: s.body, repeatTo: repeat})
					s = &b.steps[len(b.steps)-1]
					repeat = 0
				}
				s.quote = strings.TrimPrefix(l, "# ")
			case strings.HasPrefix(l, "# the "):
				if n, ok := ordinals[strings.Fields(l)[2]]; ok {
					repeat = n
				}
			default:
				if m := serveConfig.FindStringSubmatch(l + " "); m != nil {
					config = m[1]
				}
			}
		}
		// An answer quoted as the JSON block right after the commands.
		if n := len(b.steps); n > 0 && b.steps[n-1].quote == "" {
			k := i + 1
			for k < len(lines) && strings.TrimSpace(lines[k]) == "" {
				k++
			}
			if k < len(lines) && lines[k] == "```json" {
				var q []string
				for k++; k < len(lines) && !strings.HasPrefix(lines[k], "```"); k++ {
					q = append(q, strings.TrimSpace(lines[k]))
				}
				b.steps[n-1].quote = strings.Join(q, "")
			}
		}
		if len(b.steps) > 0 {
			b.config = config
			blocks = append(blocks, b)
		}
		config = "examples/shop.yaml" // a rule file named in the prose is for the next block
	}
	return blocks
}

// post sends body (a GET when empty) and returns the answer's body.
func post(t *testing.T, base, path, body string) string {
	t.Helper()
	var resp *http.Response
	var err error
	if body == "" {
		resp, err = http.Get(base + path)
	} else {
		resp, err = http.Post(base+path, "application/json", strings.NewReader(body))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// quoteMatches reports whether answer is what quote shows, abridged as
// the test's doc comment says.
func quoteMatches(quote, answer string) bool {
	quote = momentary.ReplaceAllString(quote, "$1$2$3\x00")
	var re strings.Builder
	re.WriteString("^")
	for i, part := range strings.Split(quote, "...") {
		if i > 0 {
			re.WriteString(".*?")
		}
		re.WriteString(strings.ReplaceAll(regexp.QuoteMeta(part), "\x00", `[^",]*`))
	}
	re.WriteString("$")
	return regexp.MustCompile(re.String()).MatchString(answer)
}

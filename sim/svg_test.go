package sim

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// svgShape parses an SVG document and counts its drawn series (polylines)
// and bars (rects with a title), and returns its text.
func svgShape(t *testing.T, doc []byte) (lines, bars int, text string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	root := ""
	inRect, titled := false, false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
				if el.Name.Space != "http://www.w3.org/2000/svg" {
					t.Fatalf("root element in namespace %q", el.Name.Space)
				}
			}
			switch el.Name.Local {
			case "polyline":
				lines++
			case "rect":
				inRect, titled = true, false
			case "title":
				titled = titled || inRect
			case "script", "foreignObject", "image", "use":
				t.Fatalf("an SVG with <%s>: it must stand alone and run nothing", el.Name.Local)
			}
		case xml.EndElement:
			if el.Name.Local == "rect" {
				if titled {
					bars++
				}
				inRect = false
			}
		case xml.CharData:
			text += string(el)
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return lines, bars, text
}

// Every scenario draws as SVG: well-formed, standing alone, with what its
// chart says to draw; a custom run draws its limits as lines; text is
// escaped.
func TestEveryScenarioDrawsAsSVG(t *testing.T) {
	want := map[string]struct{ lines, bars int }{
		"token-vs-leaky":       {3, 0},
		"gcra-vs-token-bucket": {0, 16}, // 8 requests x 2 algorithms
		"windows":              {0, 18}, // 3 cases x 6 columns
		"race":                 {0, 8},  // 4 methods x 2 columns
		"shared-vs-local":      {0, 16}, // 8 requests x 2 setups
		"distributed":          {0, 96}, // 48 configurations x 2 columns
		"overload":             {0, 60}, // 5 contenders x 6 loads x 2 columns
		"regions":              {4, 0},  // 3 regions and the limit
	}
	for _, r := range ranScenarios(t) {
		s, rep := r.Scenario, r.rep
		var buf bytes.Buffer
		if err := rep.Write(&buf, "svg"); err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		lines, bars, text := svgShape(t, buf.Bytes())
		w, ok := want[s.Name]
		if !ok {
			t.Fatalf("scenario %s has no expectation here", s.Name)
		}
		if lines != w.lines || bars < w.bars {
			t.Errorf("%s: %d lines and %d bars, want %d and at least %d", s.Name, lines, bars, w.lines, w.bars)
		}
		if !strings.Contains(text, s.Name) {
			t.Errorf("%s: the SVG does not carry its title", s.Name)
		}
	}
	l := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20, Algorithm: sluice.TokenBucket}
	rep, err := Custom(&CustomSpec{Seed: 7, Duration: 5 * time.Second, Background: 6, Limits: []sluice.Limit{l, l}})
	if err != nil {
		t.Fatal(err)
	}
	rep.Title = `custom <b>"&"</b>`
	var buf bytes.Buffer
	if err := rep.Write(&buf, "svg"); err != nil {
		t.Fatal(err)
	}
	if lines, _, text := svgShape(t, buf.Bytes()); lines != 3 || !strings.Contains(text, `custom <b>"&"</b>`) {
		t.Errorf("custom: %d lines (want in and two limits), title %q", lines, text)
	}
}

package sim

import (
	"bytes"
	"encoding/base64"
	"os"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluice-rl/sluice/internal/testkit/browsertest"
	"github.com/sluice-rl/sluice/rules"
)

// Every picture, rendered by a browser: each bar group has its label, and
// no two texts (title, ticks, labels, axis name, legend) overlap or leave
// the picture, whatever the number of groups (overload has 88) or the
// length of their labels (race's run to 45 characters). A replay draws too.
func TestSVGTextsDoNotOverlapInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	type picture struct {
		name   string
		doc    []byte
		groups int // bar groups; 0 for lines
	}
	var pics []picture
	for _, r := range ranScenarios(t) {
		s, rep := r.Scenario, r.rep
		var buf bytes.Buffer
		if err := rep.Write(&buf, "svg"); err != nil {
			t.Fatal(err)
		}
		groups := len(rep.Rows)
		if rep.Chart != nil && rep.Chart.Lines {
			groups = 0
		}
		pics = append(pics, picture{s.Name, buf.Bytes(), groups})
	}
	f, err := os.Open("../examples/access.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := rules.Load("../examples/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Replay(f, cfg, ReplayOptions{TopKeys: 5})
	if err != nil {
		t.Fatal(err)
	}
	rep := res.Report()
	var buf bytes.Buffer
	if err := rep.Write(&buf, "svg"); err != nil {
		t.Fatal(err)
	}
	groups := len(rep.Rows)
	if rep.Chart != nil && rep.Chart.Lines {
		groups = 0
	}
	pics = append(pics, picture{"replay", buf.Bytes(), groups})

	br := browsertest.Start(t)
	for _, p := range pics {
		url := "data:image/svg+xml;base64," + base64.StdEncoding.EncodeToString(p.doc)
		if err := chromedp.Do(br.Ctx, chromedp.Navigate(url)); err != nil {
			t.Fatal(err)
		}
		got, err := chromedp.Run(br.Ctx, chromedp.Evaluate[struct {
			Labels   int
			Overlaps []string
			Outside  []string
		}](`(() => {
			const svg = document.documentElement;
			const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
			const texts = [...document.querySelectorAll("text")].filter(t => t.getAttribute("class") !== "mark");
			const boxes = texts.map(t => { const r = t.getBoundingClientRect(); return {t: t.textContent.slice(0, 40), l: r.left, r: r.right, u: r.top, d: r.bottom}; });
			const overlaps = [], outside = [];
			for (let i = 0; i < boxes.length; i++) {
				const a = boxes[i];
				if (a.l < -0.5 || a.u < -0.5 || a.r > W + 0.5 || a.d > H + 0.5) outside.push(a.t);
				for (let j = i + 1; j < boxes.length; j++) {
					const b = boxes[j];
					if (a.l < b.r - 0.5 && b.l < a.r - 0.5 && a.u < b.d - 0.5 && b.u < a.d - 0.5) overlaps.push(a.t + " / " + b.t);
				}
			}
			return {labels: document.querySelectorAll("text.label").length, overlaps: overlaps.slice(0, 5), outside: outside.slice(0, 5)};
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if p.groups >= 0 && got.Labels != p.groups {
			t.Errorf("%s: %d group labels for %d groups", p.name, got.Labels, p.groups)
		}
		if len(got.Overlaps) > 0 || len(got.Outside) > 0 {
			t.Errorf("%s: texts overlapping %q; outside the picture %q", p.name, got.Overlaps, got.Outside)
		}
	}
}

// The request refused in gcra-vs-token-bucket shows in its picture, though
// its bars (what remains) are 0, as the allowed requests' around it are.
func TestARefusedRequestShowsInItsPicture(t *testing.T) {
	for _, s := range Scenarios() {
		if s.Name != "gcra-vs-token-bucket" {
			continue
		}
		rep, err := s.Run()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := rep.Write(&buf, "svg"); err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(buf.Bytes(), []byte(`class="mark"`)); n != 1 || !bytes.Contains(buf.Bytes(), []byte("6: rejected by gcra, token-bucket")) {
			t.Fatalf("%d marks of a refusal, want 1 for request 6:\n%s", n, buf.Bytes())
		}
		return
	}
	t.Fatal("no gcra-vs-token-bucket scenario")
}

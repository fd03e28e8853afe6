package sim

import (
	"bytes"
	"html/template"
	"io"
	"strconv"
	"time"
)

// WriteHTML writes the replay as one self-contained HTML page (no script,
// no external reference): the per-minute chart of what enforced rules
// would reject and what only shadow rules would, the per-rule table and
// every rule's top keys. Text is escaped by html/template; the chart is
// the report's SVG, inline.
func (res *ReplayResult) WriteHTML(w io.Writer) error {
	chart := &Report{
		Title:   "Would-be rejections per minute",
		Columns: []string{"minute", "enforced", "shadow only"},
		Chart:   &Chart{Y: []string{"enforced", "shadow only"}, YLabel: "requests"},
	}
	for m, n := range res.PerMinute {
		chart.Rows = append(chart.Rows, []string{res.From.Add(time.Duration(m) * time.Minute).Format("15:04"), strconv.Itoa(n), strconv.Itoa(res.ShadowPerMinute[m])})
	}
	var svg bytes.Buffer
	if len(chart.Rows) > 0 {
		if err := chart.writeSVG(&svg); err != nil {
			return err
		}
	}
	rep := res.Report()
	return replayPage.Execute(w, struct {
		Title   string
		Columns []string
		Rows    [][]string
		Chart   template.HTML
		Rules   []RuleReplay
	}{rep.Title, rep.Columns, rep.Rows, template.HTML(svg.String()), res.Rules})
}

var replayPage = template.Must(template.New("replay").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sluice replay</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { text-align: left; padding: .25em .7em; border-bottom: 1px solid #e5e5e5; }
h1 { font-size: 1.2em; } h2 { font-size: 1.05em; margin-top: 1.5em; }
</style></head>
<body>
<h1>{{.Title}}</h1>
{{if .Chart}}<h2>Per minute</h2>
<div id="chart">{{.Chart}}</div>{{end}}
<h2>Rules</h2>
<table id="rules"><thead><tr>{{range .Columns}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</tbody></table>
<h2>Top keys by rejections</h2>
<table id="keys"><thead><tr><th>rule</th><th>key</th><th>would reject</th></tr></thead>
<tbody>{{range $r := .Rules}}{{range .TopKeys}}<tr><td>{{$r.Rule}}</td><td><code>{{.Key}}</code></td><td>{{.Rejected}}</td></tr>{{end}}{{end}}</tbody></table>
</body></html>
`))

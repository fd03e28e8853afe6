package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Chart says how a report is drawn as SVG: Lines over the X column (a
// time, such as the second), or by default bars, one group per row and one
// bar per Y column. Y lists the columns drawn (default: every numeric
// column after the first); cells reading "allowed" and "rejected" count as
// 1 and 0, so a table of answers draws too.
type Chart struct {
	Lines  bool
	X      string
	Y      []string
	YLabel string
}

// palette is colour-blind safe (Okabe and Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

func cellValue(s string) (float64, bool) {
	switch s {
	case "allowed":
		return 1, true
	case "rejected":
		return 0, true
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	return v, err == nil
}

// column returns the index of name, or -1.
func (r *Report) column(name string) int {
	for i, c := range r.Columns {
		if c == name {
			return i
		}
	}
	return -1
}

// numeric reports whether every cell of column i has a value.
func (r *Report) numeric(i int) bool {
	for _, row := range r.Rows {
		if _, ok := cellValue(row[i]); !ok {
			return false
		}
	}
	return len(r.Rows) > 0
}

// writeSVG draws r (see Chart) as a self-contained SVG document: no script,
// no external reference, text escaped. It lays the picture out, then draws
// it top to bottom: title, y axis, the lines or the bars with their
// labels, the x axis, the legend.
func (r *Report) writeSVG(w io.Writer) error {
	ch := r.Chart
	if ch == nil {
		ch = &Chart{}
	}
	ys, err := r.drawnColumns(ch)
	if err != nil {
		return err
	}
	l := r.layOut(ch, ys)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", l.width, l.height, l.width, l.height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	for k, line := range l.titleLines {
		fmt.Fprintf(&b, `<text class="title" x="%.0f" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", svgLeft, 22+18*float64(k), html.EscapeString(line))
	}
	// The y axis: five ticks from 0 to hi.
	for k := 0; k <= 5; k++ {
		v := l.hi * float64(k) / 5
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", svgLeft, svgLeft+l.plotW, l.y(v), l.y(v))
		fmt.Fprintf(&b, `<text class="tick" x="%.0f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", svgLeft-6, l.y(v)+4, strconv.FormatFloat(v, 'g', 4, 64))
	}
	if ch.YLabel != "" {
		fmt.Fprintf(&b, `<text transform="translate(14 %.0f) rotate(-90)" text-anchor="middle" fill="#555">%s</text>`+"\n", l.top+svgPlotH/2, html.EscapeString(ch.YLabel))
	}
	if ch.Lines {
		if err := r.drawLines(&b, &l, ch, ys); err != nil {
			return err
		}
	} else {
		r.drawBars(&b, &l, ys)
	}
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", svgLeft, svgLeft+l.plotW, l.top+svgPlotH, l.top+svgPlotH)
	for s, i := range ys {
		k := l.keys[s]
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text class="legend" x="%.0f" y="%.0f">%s</text>`+"\n",
			k.x, k.y, palette[s%len(palette)], k.x+14, k.y+9, html.EscapeString(r.Columns[i]))
	}
	b.WriteString("</svg>\n")
	_, err = io.WriteString(w, b.String())
	return err
}

// drawnColumns are the columns the chart draws: the chart's Y, or every
// numeric column but the first.
func (r *Report) drawnColumns(ch *Chart) ([]int, error) {
	var ys []int
	for _, name := range ch.Y {
		if i := r.column(name); i >= 0 && r.numeric(i) {
			ys = append(ys, i)
		} else {
			return nil, fmt.Errorf("sim: chart column %q is not a numeric column of %q", name, r.Title)
		}
	}
	if len(ys) == 0 {
		for i := 1; i < len(r.Columns); i++ {
			if r.numeric(i) {
				ys = append(ys, i)
			}
		}
	}
	if len(ys) == 0 || len(r.Rows) == 0 {
		return nil, fmt.Errorf("sim: %q has nothing to draw", r.Title)
	}
	return ys, nil
}

// The picture's fixed measures: margins and the plot's height.
const svgLeft, svgRight, svgPlotH = 64.0, 16.0, 290.0

// svgLayout is where everything of a picture goes.
type svgLayout struct {
	plotW, width, height, top float64
	band                      float64                  // under the axis: the groups' labels, or the x ticks
	labels                    []string                 // each bar group's
	upright                   bool                     // the labels turned upright (many groups)
	titleLines                []string                 // the title, wrapped to the width
	keys                      []struct{ x, y float64 } // the legend's entries
	hi                        float64                  // the y axis' top
}

// y is where value v stands.
func (l *svgLayout) y(v float64) float64 { return l.top + svgPlotH - v/l.hi*svgPlotH }

// layOut lays r's picture out: a plot 820 px wide, wider for many bar
// groups (each at least minGroup, so that every group's label fits beside
// the next); the title wrapped to the width; under the axis, each group's
// label (wrapped for a few groups, turned upright for many), the axis name
// and the legend, each in its own band, so that no two texts overlap.
func (r *Report) layOut(ch *Chart, ys []int) svgLayout {
	l := svgLayout{plotW: 820.0}
	labelLines := 1
	if !ch.Lines {
		for _, row := range r.Rows {
			l.labels = append(l.labels, rowLabel(r, row, ys))
		}
		l.plotW = max(l.plotW, float64(len(r.Rows))*minGroup)
		group := l.plotW / float64(len(r.Rows))
		perLine := int(group * 0.95 / charW)
		for _, label := range l.labels {
			lines := wrapWords(label, perLine)
			if len(lines) > maxLabelLines || perLine < 4 {
				l.upright = true
			}
			for _, line := range lines {
				l.upright = l.upright || len(line) > perLine // a word wider than its group
			}
			labelLines = max(labelLines, len(lines))
		}
	}
	l.width = svgLeft + l.plotW + svgRight
	l.titleLines = wrapWords(r.Title, int((l.width-svgLeft-svgRight)/titleCharW))
	l.top = 22 + 18*float64(len(l.titleLines)-1) + 18.0
	l.band = 20.0
	switch {
	case ch.Lines:
	case l.upright:
		longest := 0
		for _, label := range l.labels {
			longest = max(longest, len(label))
		}
		l.band = float64(longest)*charW + 10
	default:
		l.band = float64(labelLines)*14 + 6
	}
	// The legend's rows, as wide as the chart.
	lx, ly := svgLeft, l.top+svgPlotH+l.band+30
	for _, i := range ys {
		wide := 24 + charW*float64(len(r.Columns[i]))
		if lx+wide > l.width-svgRight && lx > svgLeft {
			lx, ly = svgLeft, ly+16
		}
		l.keys = append(l.keys, struct{ x, y float64 }{lx, ly})
		lx += wide
	}
	l.height = ly + 24
	for _, row := range r.Rows {
		for _, i := range ys {
			v, _ := cellValue(row[i])
			l.hi = max(l.hi, v)
		}
	}
	l.hi = niceCeil(l.hi)
	return l
}

// drawLines draws a line per drawn column over the numeric x column.
func (r *Report) drawLines(b *strings.Builder, l *svgLayout, ch *Chart, ys []int) error {
	xi := r.column(ch.X)
	if xi < 0 || !r.numeric(xi) {
		return fmt.Errorf("sim: chart x column %q is not a numeric column of %q", ch.X, r.Title)
	}
	lo, xhi := math.Inf(1), math.Inf(-1)
	for _, row := range r.Rows {
		v, _ := cellValue(row[xi])
		lo, xhi = min(lo, v), max(xhi, v)
	}
	x := func(v float64) float64 {
		if xhi == lo {
			return svgLeft
		}
		return svgLeft + (v-lo)/(xhi-lo)*l.plotW
	}
	for k := 0; k <= 5; k++ {
		v := lo + (xhi-lo)*float64(k)/5
		fmt.Fprintf(b, `<text class="tick" x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", x(v), l.top+svgPlotH+16, strconv.FormatFloat(v, 'g', 4, 64))
	}
	fmt.Fprintf(b, `<text class="axis" x="%.0f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", svgLeft+l.plotW/2, l.top+svgPlotH+l.band+14, html.EscapeString(ch.X))
	for s, i := range ys {
		pts := make([]string, 0, len(r.Rows))
		for _, row := range r.Rows {
			xv, _ := cellValue(row[xi])
			yv, _ := cellValue(row[i])
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(xv), l.y(yv)))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n", palette[s%len(palette)], strings.Join(pts, " "), html.EscapeString(r.Columns[i]))
	}
	return nil
}

// drawBars draws a group of bars per row, each group labelled, a refused
// request's group marked.
func (r *Report) drawBars(b *strings.Builder, l *svgLayout, ys []int) {
	group := l.plotW / float64(len(r.Rows))
	bar := group * 0.8 / float64(len(ys))
	for g, row := range r.Rows {
		x0 := svgLeft + float64(g)*group + group*0.1
		for s, i := range ys {
			v, _ := cellValue(row[i])
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				x0+float64(s)*bar, l.y(v), max(bar-1, 0.5), l.top+svgPlotH-l.y(v), palette[s%len(palette)],
				html.EscapeString(row[0]), html.EscapeString(r.Columns[i]), html.EscapeString(row[i]))
		}
		// Every group has its label: upright (reading upwards) for
		// many groups, else wrapped to the group's width.
		cx := x0 + group*0.4
		if l.upright {
			fmt.Fprintf(b, `<text class="label" transform="translate(%.1f %.0f) rotate(-90)" text-anchor="end" dominant-baseline="middle" fill="#555">%s</text>`+"\n", cx, l.top+svgPlotH+6, html.EscapeString(l.labels[g]))
		} else {
			fmt.Fprintf(b, `<text class="label" x="%.1f" y="%.0f" text-anchor="middle" fill="#555">`, cx, l.top+svgPlotH+16)
			for k, line := range wrapWords(l.labels[g], int(group*0.95/charW)) {
				fmt.Fprintf(b, `<tspan x="%.1f" dy="%d">%s</tspan>`, cx, min(k, 1)*14, html.EscapeString(line))
			}
			b.WriteString("</text>\n")
		}
		// A refused request shows: a red cross over its group (its bars
		// may be 0, and would not show at all).
		var refusedBy []string
		for i, c := range row {
			if c == "rejected" {
				refusedBy = append(refusedBy, r.Columns[i])
			}
		}
		if len(refusedBy) > 0 {
			fmt.Fprintf(b, `<text class="mark" x="%.1f" y="%.1f" text-anchor="middle" font-size="13" font-weight="bold" fill="#c0392b">&#x2715;<title>%s: rejected by %s</title></text>`+"\n",
				cx, l.top+svgPlotH-4, html.EscapeString(row[0]), html.EscapeString(strings.Join(refusedBy, ", ")))
		}
	}
	fmt.Fprintf(b, `<text class="axis" x="%.0f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", svgLeft+l.plotW/2, l.top+svgPlotH+l.band+14, html.EscapeString(r.Columns[0]))
}

// rowLabel names a bar group: the row's cells that are not drawn, joined.
func rowLabel(r *Report, row []string, drawn []int) string {
	var parts []string
	for i, c := range row {
		isY := false
		for _, y := range drawn {
			isY = isY || y == i
		}
		if !isY {
			parts = append(parts, c)
		}
	}
	return strings.Join(parts, " ")
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1), so
// the axis ticks are round numbers.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// The text metrics the layout assumes: an upper bound on the advance of a
// character of 12 px sans-serif (and of 14 px bold, for the title), so that
// texts laid out apart do not meet in any common font (TestSVGTextsDoNotOverlap
// measures them in a browser).
const (
	charW         = 7.2
	titleCharW    = 8.6
	minGroup      = 16.0 // an upright label's height, and room
	maxLabelLines = 3
)

// wrapWords breaks s into lines of at most n characters, at spaces (a
// longer word has a line of its own).
func wrapWords(s string, n int) []string {
	if n < 1 {
		n = 1
	}
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= n:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	return append(lines, line)
}
